"""This replica's view of the live members, fed by a KV watch and a periodic full read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hrwcron.core.model import Heartbeat
from hrwcron.core.turns import Candidate
from hrwcron.engine.ports import MemberRecord


@dataclass
class _Seen:
    record: MemberRecord
    seen_mono: float


class MembershipView:
    """A member counts as live while its heartbeat revision keeps changing within ``ttl`` by this
    replica's own monotonic clock. Expiry in the bucket sends no event to watchers, so the local
    age check (and the periodic full read) is what drops a member that died silently."""

    def __init__(self, self_node: str, ttl: float, monotonic: Callable[[], float]) -> None:
        self.self_node = self_node
        self.ttl = ttl
        self._monotonic = monotonic
        self._members: dict[str, _Seen] = {}

    def update(self, node: str, record: MemberRecord | None) -> None:
        if record is None:
            self._members.pop(node, None)
            return
        known = self._members.get(node)
        if known is None or known.record.revision < record.revision:
            self._members[node] = _Seen(record, self._monotonic())

    def replace_all(self, records: dict[str, MemberRecord]) -> None:
        for node in list(self._members):
            if node not in records:
                del self._members[node]
        for node, record in records.items():
            self.update(node, record)

    def heard(self, node: str) -> tuple[Heartbeat, float] | None:
        """The member's newest heartbeat and when (this replica's monotonic clock) it came."""
        seen = self._members.get(node)
        return None if seen is None else (seen.record.heartbeat, seen.seen_mono)

    def age(self, node: str) -> float | None:
        seen = self._members.get(node)
        return None if seen is None else self._monotonic() - seen.seen_mono

    def heartbeats(self) -> dict[str, tuple[Heartbeat, float]]:
        """Every member still in the view with its age in seconds (live or not)."""
        now = self._monotonic()
        return {n: (s.record.heartbeat, now - s.seen_mono) for n, s in self._members.items()}

    def live(self, self_weight: float, self_tags: list[str]) -> list[Candidate]:
        """Every member heard from within the TTL, ready or not, this replica included."""
        now = self._monotonic()
        found = [
            Candidate(node, s.record.heartbeat.weight, frozenset(s.record.heartbeat.tags))
            for node, s in self._members.items()
            if node != self.self_node and now - s.seen_mono < self.ttl
        ]
        found.append(Candidate(self.self_node, self_weight, frozenset(self_tags)))
        found.sort(key=lambda c: c.node)
        return found

    def candidates(
        self, self_ready: bool, self_weight: float, self_tags: list[str]
    ) -> list[Candidate]:
        """Live, ready members (this replica judged by its own readiness, not its last beat)."""
        now = self._monotonic()
        found = [
            Candidate(node, s.record.heartbeat.weight, frozenset(s.record.heartbeat.tags))
            for node, s in self._members.items()
            if node != self.self_node and s.record.heartbeat.ready and now - s.seen_mono < self.ttl
        ]
        if self_ready:
            found.append(Candidate(self.self_node, self_weight, frozenset(self_tags)))
        found.sort(key=lambda c: c.node)
        return found
