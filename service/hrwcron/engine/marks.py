"""Progress marks: how far each owner has got with its ticks, so the others need not act on
them while it keeps up.

A ready replica announces a mark every quarter failover step: every tick it owns whose fire
instant is at or before ``resolved_ms`` is resolved, ``resolved`` counts the ticks it has
resolved since it started, and ``jobs_revision`` is the newest job change it has applied.

A follower whose turn on a tick has come asks :meth:`MarksHeard.verdict` about the tick's owner:

- ``DONE``: the owner's mark has passed the tick (published, skipped, excluded or missed),
  so there is nothing to do and nothing to read;
- ``BUSY``: the owner is live and its marks advance, but it has not reached the tick yet (a
  herd, a slow store): wait for it, never pile claims and publishes on a live owner;
- ``UNKNOWN``: no fresh mark from the owner's live instance, a mark that stopped advancing for
  a claim lease, a mark from before the follower's version of the job, or one made under
  another view of the members than the follower's: act as without marks.

A mark only decides who spends effort: the claim, the Msg-Id and the fence still decide who
publishes, so a lost, late or stale mark costs work or lateness, never a duplicate. A follower
trusts only a mark made under its own view of the members (``view``: the ready members, their
weights and the holders setting): under one view every replica names the same owner, and that
owner holds the job. A replica still reading lanes it took on announces no mark at all. When
views differ, a follower acts at its own turn as without marks, until they agree again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

# Verdicts; UNKNOWN is the only false one.
UNKNOWN = 0
DONE = 1
BUSY = 2

# Marks per failover step: a live owner's newest mark is never older than half a step, so a
# silent one is noticed before its followers' turns are over.
MARKS_PER_STEP = 4


class Mark(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    node: str
    instance: str
    resolved_ms: int
    resolved: int
    jobs_revision: int
    view: int = 0  # Membership.view_id of the owner when it made the mark


@dataclass(slots=True)
class _Heard:
    mark: Mark
    heard_mono: float
    advanced_mono: float


class MarksHeard:
    """The newest mark of every other replica, as heard here, and what it says of a tick."""

    def __init__(
        self,
        *,
        step: float,
        lease: float,
        monotonic: Callable[[], float],
        live: Callable[[str, str], bool],
        view: Callable[[], int] = lambda: 0,
    ) -> None:
        """``live(node, instance)``: whether that instance is a live, ready member here;
        ``view()``: this replica's view of the members now (Membership.view_id)."""
        self._fresh = step * 2 / MARKS_PER_STEP
        self._lease = lease
        self._monotonic = monotonic
        self._live = live
        self._view = view
        self.heard: dict[str, _Heard] = {}

    def hear(self, mark: Mark) -> bool:
        """Record ``mark``; True when it says its owner moved on since its previous one."""
        now = self._monotonic()
        before = self.heard.get(mark.node)
        if before is None or before.mark.instance != mark.instance:
            self.heard[mark.node] = _Heard(mark, now, now)
            return True
        moved = mark.resolved > before.mark.resolved or mark.resolved_ms > before.mark.resolved_ms
        before.mark = mark
        before.heard_mono = now
        if moved:
            before.advanced_mono = now
        return moved

    def verdict(self, owner: str | None, fire_ms: int, job_revision: int) -> int:
        heard = self.heard.get(owner) if owner is not None else None
        if heard is None:
            return UNKNOWN
        mark = heard.mark
        now = self._monotonic()
        if now - heard.heard_mono > self._fresh or not self._live(mark.node, mark.instance):
            return UNKNOWN
        if mark.view != self._view():
            return UNKNOWN  # the owner may name another owner, or not hold the job at all
        if mark.jobs_revision < job_revision:
            return UNKNOWN  # the owner may not know this version of the job yet
        if mark.resolved_ms >= fire_ms:
            return DONE
        if now - heard.advanced_mono <= self._lease:
            return BUSY
        return UNKNOWN

    def mark_of(self, owner: str) -> Mark | None:
        heard = self.heard.get(owner)
        return heard.mark if heard is not None else None

    def silent(self, owner: str) -> bool:
        """Whether ticks parked on ``owner`` must be looked at again."""
        heard = self.heard.get(owner)
        if heard is None:
            return True
        now = self._monotonic()
        return (
            now - heard.heard_mono > self._fresh
            or now - heard.advanced_mono > self._lease
            or heard.mark.view != self._view()
            or not self._live(heard.mark.node, heard.mark.instance)
        )
