"""The fleet as this replica sees it: members, the job set in a few numbers, the next hour's
ticks per member and minute with the heaviest seconds named (herds are where lateness comes
from), and the last hour's published, late and missed ticks.

The timeline walks every job, in slices, so one walk counts the ticks of a longer stretch than
an hour and is kept for TIMELINE_TTL_S (rebuilt sooner only when the jobs or the members
change): each view shows the hour from its own minute out of it. Its cost does not grow with
the number of people looking.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hrwcron.adapters.telemetry import Telemetry
from hrwcron.adapters.tick_log import Minute
from hrwcron.admin.job_pages import summary
from hrwcron.admin.status import ReplicaStatus
from hrwcron.admin.ticks_ahead import count_ticks_ahead
from hrwcron.engine.queries import EngineQueries

HOUR_MS = 3_600_000
MINUTE_MS = 60_000
TIMELINE_TTL_S = 300.0
# What one walk covers: the hour shown, and the minutes the walk is kept for.
COVERED_MS = HOUR_MS + int(TIMELINE_TTL_S * 1000) + MINUTE_MS
# However many pages ask, the members and numbers are gathered at most this often.
FLEET_TTL_S = 2.0
# Ticks one timeline counts at most; past it the timeline says it is partial.
TICK_BUDGET = 400_000
SEARCH_BUDGET = 400_000
HEAVIEST = 5


@dataclass
class Timeline:
    start_ms: int
    per_member: dict[str, list[int]]  # ticks per minute from start_ms, by current owner
    heaviest: list[tuple[int, int]]  # (second in epoch ms, ticks) of the busiest seconds
    ticks: int
    partial: bool


@dataclass
class _Walk:
    """One walk over every job: ticks per member and minute, and per second, from start_ms
    for COVERED_MS."""

    key: tuple[object, ...]
    built_at: float
    start_ms: int
    per_member: dict[str, list[int]]
    seconds: collections.Counter[int]
    partial: bool

    def hour_from(self, now: int) -> Timeline:
        first = (now - self.start_ms) // MINUTE_MS
        rows = {node: counts[first : first + 61] for node, counts in self.per_member.items()}
        since = now // 1000
        until = (now + HOUR_MS) // 1000
        heavy = [(sec, n) for sec, n in self.seconds.items() if since <= sec <= until]
        heavy.sort(key=lambda item: (-item[1], item[0]))
        heaviest = [(sec * 1000, n) for sec, n in heavy[:HEAVIEST]]
        start = self.start_ms + first * MINUTE_MS
        return Timeline(start, rows, heaviest, sum(map(sum, rows.values())), self.partial)


@dataclass
class Fleet:
    node: str
    now_ms: int
    ready: bool
    reason: str
    offset_ms: float
    digest: str
    members: list[dict[str, Any]]
    owned: dict[str, int]
    summary: dict[str, Any]
    timeline: Timeline | None  # None until the first walk over the jobs is done
    minutes: list[Minute] = field(default_factory=list)


class FleetView:
    def __init__(
        self, scheduler: EngineQueries, status: ReplicaStatus, telemetry: Telemetry
    ) -> None:
        self._s = scheduler
        self._status = status
        self._telemetry = telemetry
        self._walk: _Walk | None = None
        self._building = asyncio.Lock()
        self._fleet: tuple[float, Fleet] | None = None
        self._walking: asyncio.Task[Timeline] | None = None
        self.walks = 0  # walks done: a page showing an older one fetches the fleet again

    async def close(self, app: object = None) -> None:
        if self._walking is not None:
            self._walking.cancel()

    async def fleet(self) -> Fleet:
        mono = self._s.clock.monotonic()
        if self._fleet is not None and mono - self._fleet[0] < FLEET_TTL_S:
            return self._fleet[1]
        fleet = await self._gather()
        self._fleet = (mono, fleet)
        return fleet

    async def _gather(self) -> Fleet:
        s = self._s
        now = int(s.clock.now_ms())
        reason = self._status.not_ready_reason()
        return Fleet(
            node=s.node,
            now_ms=now,
            ready=not reason,
            reason=reason,
            offset_ms=round(s.clock.offset_ms, 1),
            digest=s.digest,
            members=self._status.members(),
            owned=dict(sorted(s.owned_counts.items())),
            summary=msgspec.to_builtins(await summary(s)),
            timeline=self.timeline_now(now),
            minutes=self._telemetry.tick_log.minutes(now),
        )

    def timeline_now(self, now: int) -> Timeline | None:
        """The next hour from the newest walk, without waiting for one: a page shows what is
        known at once, and a walk that is due runs in the background (a pulse tells the page
        when it is done)."""
        s = self._s
        known = self._walk
        key = (s.jobs_revision, tuple(self._telemetry.live))
        fresh = known and known.key == key and s.clock.monotonic() - known.built_at < TIMELINE_TTL_S
        if not fresh and (self._walking is None or self._walking.done()):
            self._walking = asyncio.create_task(self.timeline(), name="console-timeline")
        return known.hour_from(now) if known else None

    async def timeline(self) -> Timeline:
        async with self._building:
            s = self._s
            key = (s.jobs_revision, tuple(self._telemetry.live))
            known = self._walk
            mono = s.clock.monotonic()
            if not (known and known.key == key and mono - known.built_at < TIMELINE_TTL_S):
                known = self._walk = await self._build(key, mono)
                self.walks += 1
                self._fleet = None  # the next view shows this walk
            return known.hour_from(int(s.clock.now_ms()))

    async def _build(self, key: tuple[object, ...], mono: float) -> _Walk:
        s = self._s
        ahead = await count_ticks_ahead(
            s,
            self._telemetry.live,
            int(s.clock.now_ms()),
            span_ms=COVERED_MS,
            bucket_ms=MINUTE_MS,
            tick_budget=TICK_BUDGET,
            search_budget=SEARCH_BUDGET,
        )
        return _Walk(key, mono, ahead.start_ms, ahead.per_member, ahead.seconds, ahead.partial)
