"""Membership and readiness: this replica's heartbeat, its view of the others, who ranks where.

It writes the heartbeat (and learns the clock offset from it), keeps the member view fresh by a
watch and a periodic full read, says whether this replica may claim (fail closed), compares the
job digests the replicas announce, and ranks a job's candidates once per change of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from hrwcron import __version__
from hrwcron.core import hrw, partitions
from hrwcron.core.errors import ConflictError, DuplicateNodeError, HrwcronError
from hrwcron.core.model import Heartbeat
from hrwcron.core.turns import Candidate, ranking
from hrwcron.engine.clock import Clock
from hrwcron.engine.jobs import HeldClaim, Job
from hrwcron.engine.ports import MembersPort, Observer, ServerTime
from hrwcron.engine.settings import Settings
from hrwcron.engine.view import MembershipView

log = logging.getLogger("hrwcron.scheduler")


class ReplicaState(Protocol):
    """What membership announces about the rest of the replica."""

    @property
    def stopping(self) -> bool: ...
    @property
    def loading(self) -> bool: ...
    @property
    def digest(self) -> str: ...
    @property
    def job_count(self) -> int: ...


class Membership:
    """Heartbeats, the live members, readiness and the candidates' order."""

    def __init__(
        self,
        settings: Settings,
        members: MembersPort,
        *,
        instance: str,
        observer: Observer,
        clock: Clock,
        state: ReplicaState,
        changed: Callable[[bool, bool], None],
        held: Callable[[frozenset[str] | None], None] = lambda lanes: None,
    ) -> None:
        """``changed(readiness, candidates)`` is told when either changed; ``held(lanes)``
        when the lanes this replica holds changed (None: it holds every job)."""
        self.settings = settings
        self.node = settings.node_id
        self.instance = instance
        self._members = members
        self._observer = observer
        self._clock = clock
        self._state = state
        self._changed = changed
        self.view = MembershipView(self.node, settings.member_ttl, clock.monotonic)
        self.fatal: HrwcronError | None = None
        self.failed = asyncio.Event()  # set with ``fatal``: the process should exit
        self.started_ms = 0
        self.candidates: list[Candidate] = []
        self.generation = 0  # bumped whenever the candidates change
        self._plain: list[tuple[bytes, str]] | None = []  # candidates for hrw.rank_prepared
        # Holding a share (settings.holders): each lane's holders among the live members, and
        # the lanes this replica holds.
        self._held = held
        self.lane_holders: dict[str, list[str]] = {}
        self._live: list[Candidate] = []
        self._live_nodes: list[str] = []
        self._ready_nodes: frozenset[str] = frozenset()
        self.held: frozenset[str] | None = None
        # Names the ready and the live members and the holders setting: marks must agree on it.
        self.view_id = 0
        # A claim holder unheard for this long has missed a heartbeat: its claim is taken over.
        interval = settings.heartbeat_interval
        self._silence = interval + max(0.25, interval / 4)
        self._revision = 0
        self._beat_ok: float | None = None
        self._view_ok: float | None = None
        self._was_ready: bool | None = None

    # ------------------------------------------------------------------------- readiness

    @property
    def not_ready_reason(self) -> str:
        """Empty when this replica may claim; otherwise why it must not (fail closed)."""
        now = self._clock.monotonic()
        if self.fatal is not None:
            return f"fatal: {self.fatal}"
        if self._state.stopping:
            return "stopping"
        if self._stale(self._beat_ok, now):
            return "heartbeat is not reaching NATS"
        if self._stale(self._view_ok, now):
            return "membership view is stale"
        if self._state.loading:
            return "loading jobs and trigger history"
        if not self._clock.estimator.known:
            return "clock offset to the NATS server is not known yet"
        if self.clock_off:
            return (
                f"clock is {abs(self._clock.offset_ms):.0f} ms off the NATS server's "
                f"(max_clock_skew is {self.settings.max_clock_skew:g} s)"
            )
        return ""

    @property
    def clock_off(self) -> bool:
        """Whether this replica's clock and the server's disagree by more than max_clock_skew:
        then neither is trusted."""
        return self._clock.disagrees(self.settings.max_clock_skew_ms)

    @property
    def ready(self) -> bool:
        return not self.not_ready_reason

    def _stale(self, last_ok: float | None, now: float) -> bool:
        """Whether a heartbeat or a view read last succeeded more than a member TTL ago."""
        return last_ok is None or now - last_ok > self.settings.member_ttl

    def _cut_off(self) -> bool:
        """Whether this replica's own heartbeat or membership view is stale."""
        now = self._clock.monotonic()
        return self._stale(self._beat_ok, now) or self._stale(self._view_ok, now)

    def refresh(self) -> None:
        """Take in a change of readiness or of the live members."""
        ready = self.ready
        ready_changed = ready != self._was_ready
        if ready_changed:
            self._was_ready = ready
            self._observer.readiness(ready, self.not_ready_reason)
        candidates = self.view.candidates(ready, self.settings.weight, list(self.settings.tags))
        changed = candidates != self.candidates
        if changed:
            self.candidates = candidates
            self._ready_nodes = frozenset(c.node for c in candidates)
            self._plain = hrw.prepare([c.node for c in candidates])
            if any(c.weight != 1.0 for c in candidates):
                self._plain = None  # weighted: turns.ranking
        if self.settings.holders > 0 and self._hold():
            changed = True
        if changed:
            self.generation += 1
            self.view_id = hrw.score(
                repr([(c.node, c.weight) for c in candidates] + self._live_nodes),
                str(self.settings.holders),
            )
        if ready_changed or changed:
            self._changed(ready_changed, changed)
        if changed:
            self._observer.membership([c.node for c in candidates], 0)
            log.info("live members: %s", ", ".join(c.node for c in candidates) or "none")

    def _hold(self) -> bool:
        """Recompute each lane's holders from every live member, ready or not (a replica that
        joins holds its lanes from its first heartbeat, so the others give them up at once
        instead of when it is ready), and the lanes this replica holds; True when the live
        members changed. Firing, a lane's holders count only while they are ready.

        While this replica cannot reach NATS itself (its heartbeat or its view is stale), the
        members it has not heard from are not known to be gone: its lanes stay as they are
        (it fires nothing meanwhile) instead of taking on every lane of a view that emptied,
        which under an overloaded server is one more load of jobs for every replica."""
        if self._live and self._cut_off():
            return False
        live = self.view.live(self.settings.weight, list(self.settings.tags))
        if live == self._live:
            return False
        self._live = live
        self._live_nodes = [c.node for c in live]
        self.lane_holders = partitions.holders_by_lane(live, self.settings.holders)
        held = partitions.held_lanes(self.node, [self.lane_holders])
        if held != self.held:
            self.held = held
            self._held(held)
        return True

    async def settle(self) -> None:
        """Wait (at most a member TTL) until no member has joined or left for a heartbeat
        interval: replicas started together would otherwise each read the lanes of a fleet
        smaller than the one that is coming, and give most of them up again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.member_ttl
        seen = self._live_nodes
        while loop.time() < deadline:
            await asyncio.sleep(self.settings.heartbeat_interval)
            self.refresh()
            if self._live_nodes == seen:
                return
            seen = self._live_nodes

    # ------------------------------------------------------------------------ the ranking

    def place(self, job: Job) -> None:
        """The job's owner and this replica's rank, computed once per change of the
        candidates. Holding a share, a job's candidates are its lane's holders."""
        if job.order_generation == self.generation:
            return
        plain = self._plain
        lane_holders = self.lane_holders.get(job.lane) if self.settings.holders > 0 else None
        if lane_holders is not None:
            order = self._among(job.spec.name, lane_holders)
        elif plain is not None and not job.spec.tags:
            order = hrw.rank_prepared(job.spec.name, plain)
        else:
            order = ranking(job.spec.name, job.spec.tags, self.candidates)
        job.first = order[0] if order else None
        job.my_rank = order.index(self.node) if self.node in order else -1
        job.order_generation = self.generation

    def _among(self, name: str, holders: list[str]) -> list[str]:
        """The ready ones of a lane's holders, in the job's HRW order."""
        ready = [node for node in holders if node in self._ready_nodes]
        if self._plain is not None:
            return hrw.rank(name, ready)
        return ranking(name, (), [c for c in self.candidates if c.node in ready])

    @property
    def live_nodes(self) -> list[str]:
        if self.settings.holders > 0:
            return list(self._live_nodes)
        return [c.node for c in self.view.live(self.settings.weight, list(self.settings.tags))]

    def first_holder(self, lane: str) -> str | None:
        """The lane's first live holder; of the tagged lane, the first live member."""
        if lane == partitions.TAGGED:
            return self._live_nodes[0] if self._live_nodes else None
        holders = self.lane_holders.get(lane)
        return holders[0] if holders else None

    def order_in_lane(self, name: str, lane: str) -> list[str]:
        return self._among(name, self.lane_holders.get(lane, []))

    def ranking_of(self, name: str, tags: list[str]) -> list[str]:
        """The candidates that would fire the job, in order: holding shares, its lane's ready
        holders (then every other candidate, who would hold it after a change of members)."""
        order = ranking(name, tags, self.candidates)
        if self.settings.holders <= 0 or tags:
            return order
        first = self._among(name, self.lane_holders.get(partitions.lane_of(name, tags), []))
        return first + [node for node in order if node not in first]

    # ------------------------------------------------------------------ claim holders

    def holder_live(self, node: str, instance: str) -> bool:
        """Whether a claim holder is live and ready in the membership view: the same instance,
        ready, and heard from within a heartbeat (plus a margin)."""
        return self._holder_silent_in(node, instance) > 0

    def _holder_silent_in(self, node: str, instance: str) -> float:
        heard = self.view.heard(node)
        if heard is None:
            return 0.0
        heartbeat, seen_mono = heard
        if heartbeat.instance != instance or not heartbeat.ready:
            return 0.0
        return seen_mono + self._silence - self._clock.monotonic()

    def holder_wait(self, held: HeldClaim) -> float | None:
        """When to look at a held claim again (server ms), or None to read it now: its
        holder fell silent, or the claim stayed unchanged for the whole lease."""
        lease_left = held.seen_mono + self.settings.claim_lease - self._clock.monotonic()
        silent_in = self._holder_silent_in(held.node, held.instance)
        if lease_left <= 0 or silent_in <= 0:
            return None
        return self._clock.now_ms() + min(lease_left, silent_in) * 1000 + 1

    # ---------------------------------------------------------------------- heartbeats

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(
            node=self.node,
            instance=self.instance,
            started_ms=self.started_ms,
            version=__version__,
            weight=self.settings.weight,
            tags=list(self.settings.tags),
            digest=self._state.digest,
            jobs=self._state.job_count,
            ready=self.ready,
            reason=self.not_ready_reason,
            http=self.settings.http_address,
            offset_ms=round(self._clock.offset_ms, 1),
        )

    async def join(self) -> None:
        """Register this node, then read the members once: a replica starts with a view."""
        self.started_ms = int(self._clock.local_ms())
        await self.beat(first=True)
        self._beat_ok = self._clock.monotonic()
        self.view.replace_all(await self._members.snapshot())
        self._view_ok = self._clock.monotonic()

    @property
    def registered(self) -> bool:
        """Whether this replica's member key was created: only then is leaving its to do."""
        return self._revision > 0

    async def leave(self) -> None:
        await self._members.deregister(self.node)

    async def beat(self, first: bool = False) -> None:
        """Write the heartbeat and learn the clock offset from the server's timestamp of it."""
        if first:
            # Registering may wait for a previous holder's key to expire: far too long a round
            # trip for a clock sample, so the sample comes from an ordinary beat right after.
            self._revision = await self._members.register(
                self.node, self.heartbeat(), wait=self.settings.member_ttl + 1
            )
        sent = self._clock.local_ms()
        self._revision = await self._members.beat(self.node, self.heartbeat(), self._revision)
        received = self._clock.local_ms()
        try:
            stored = await self._members.stored_at(self._revision)
        except Exception as exc:
            # The beat landed; only its clock sample is lost (a server too busy to answer in
            # time, or the message already expired): no reason to count the beat as failed.
            log.debug("no clock sample from heartbeat revision %d: %s", self._revision, exc)
            return
        if stored is not None:
            self._clock.estimator.add(ServerTime(sent, stored, received))

    async def heartbeat_loop(self) -> None:
        while not self._state.stopping:
            await asyncio.sleep(self.settings.heartbeat_interval)
            try:
                await self.beat()
                self._beat_ok = self._clock.monotonic()
            except ConflictError as exc:
                self.fatal = DuplicateNodeError(
                    f"node id {self.node!r} is being written by another replica: {exc}"
                )
                log.error("%s; this replica stops claiming", self.fatal)
                self.failed.set()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            age = self._clock.monotonic() - self._beat_ok if self._beat_ok else float("inf")
            self._observer.heartbeat(age < self.settings.member_ttl, self._clock.offset_ms, age)
            self.check_digests()
            self.refresh()

    async def refresh_loop(self) -> None:
        while not self._state.stopping:
            try:
                self.view.replace_all(await self._members.snapshot())
                self._view_ok = self._clock.monotonic()
            except Exception as exc:
                log.warning("membership read failed: %s", exc)
            self.refresh()
            await asyncio.sleep(self.settings.membership_refresh)

    async def watch(self) -> None:
        while not self._state.stopping:
            try:
                async for node, record in self._members.watch():
                    self.view.update(node, record)
                    self.refresh()
            except Exception as exc:
                log.warning("membership watch stopped (%s); restarting it", exc)
            await asyncio.sleep(self.settings.heartbeat_interval)

    def check_digests(self) -> None:
        """Tell the observer which live replicas announce a job digest other than ours."""
        mine = self._state.digest
        others = [
            node
            for node, (hb, age) in self.view.heartbeats().items()
            if node != self.node
            and hb.digest
            and age < self.settings.member_ttl
            and hb.digest != mine
        ]
        self._observer.digest_mismatch(others)
