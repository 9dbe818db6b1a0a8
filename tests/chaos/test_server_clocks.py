"""What "never early" means when the NATS servers' clocks disagree, on a real 3-node cluster
whose servers' wall clocks the test moves while they run (``NatsCluster(server_clocks=True)``).

Replicas take their time from the stamps of their heartbeats, so from the server leading the
members bucket; the server leading the trigger stream stamps each trigger. Each trigger is also
timed here as a subscriber receives it, on this process's clock, which keeps true time. One
scenario, phase after phase on the same cluster (members led by one node, triggers by another):

1. the trigger stream's leader 5 s ahead: replicas fire on time, its stamps are 5 s off;
2. the members leader 0.6 s ahead (below ``max_clock_skew``): replicas follow it, so triggers
   are early by at most 0.6 s on a true clock and never early on the members leader's;
3. the members leader 5 s ahead: every replica fails closed, then fires again once it is right;
4. the members leader stepped 30 s ahead and back, then 30 s back and forward again: the
   same (the ticks due meanwhile fire late, none is given up by the clock that was off);
5. the trigger stream's leader stepped back 30 s: replicas fire on time, stamps 30 s early.

Then every tick of the run is audited by its true publish time (no tick missing, doubled, out
of order, early beyond what phase 2 allows or past its lateness window).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from harness import NatsCluster, wait_for_async
from harness.chaos import MISSING, ReplicaFleet, Trigger, TriggerLog, now_ms, wait_until_ms
from harness.clock_files import needs_clockshift
from hrwcron.core.model import Heartbeat, JobSpec
from hrwcron.core.resources import SUBJECT_PREFIX, TRIGGER_STREAM
from hrwcron.process.app import Stores

from .checker import Verdict, check
from .faults import Timings
from .server_clocks import MEMBERS_STREAM, SERVER_CLOCK, lead, shift_server_clock
from .world import chaos_world, judged, stores_with_jobs

JOBS = [JobSpec(name=f"sc{i:02d}", schedule="@every 1s", max_lateness=20.0) for i in range(8)]
ENV = {"HRWCRON_SCHEDULER_REPLICAS": "3"}
SKEW_S = 0.6  # below the shipped max_clock_skew of 1 s
EARLY_TOLERANCE_MS = 50.0


class Receipts:
    """When each trigger was first received, by this process's (true) clock."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    async def take(self, msg: Msg) -> None:
        msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
        self.at.setdefault(msg_id, now_ms())

    def since(self, start_ms: float) -> dict[str, float]:
        return {k: v for k, v in self.at.items() if v >= start_ms}


@dataclasses.dataclass
class Scene:
    cluster: NatsCluster
    fleet: ReplicaFleet
    stores: Stores
    receipts: Receipts

    async def beats(self) -> dict[str, Heartbeat]:
        snapshot = await self.stores.members.snapshot()
        return {node: record.heartbeat for node, record in snapshot.items()}

    async def all_beats(self, ready: bool, reason: str = "") -> bool:
        beats = await self.beats()
        return all(
            node in beats and beats[node].ready == ready and reason in beats[node].reason
            for node in self.fleet.nodes
        )

    async def wait_all(self, ready: bool, what: str, reason: str = "") -> None:
        await wait_for_async(
            lambda: self.all_beats(ready, reason),
            timeout=30,
            interval=0.1,
            message=what,
            ignore=(NatsError, TimeoutError),
        )

    async def stored(self, start_ms: float) -> list[Trigger]:
        log = TriggerLog(self.stores.client, stream=TRIGGER_STREAM, subject_prefix=SUBJECT_PREFIX)
        await log.read()
        return [t for t in log.triggers if t.due_ms >= start_ms]


@contextlib.asynccontextmanager
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    cluster = NatsCluster(3, base_dir=tmp_path / "cluster", server_clocks=True)
    await asyncio.to_thread(cluster.start)
    fleet = ReplicaFleet(cluster.url, 3, tmp_path / "replicas", env=ENV)
    stores: Stores | None = None
    try:
        stores = await stores_with_jobs(fleet.config(), JOBS)
        receipts = Receipts()
        await stores.client.subscribe(f"{SUBJECT_PREFIX}.>", cb=receipts.take)
        for i in range(3):
            fleet.start(i, wait=False)
        for i in range(3):
            await asyncio.to_thread(fleet.wait_started, i)
        yield Scene(cluster, fleet, stores, receipts)
    finally:
        fleet.stop_all()
        if stores is not None:
            await stores.client.close()
        cluster.cleanup()


def by_receipt(triggers: list[Trigger], receipts: Receipts) -> list[Trigger]:
    """The triggers with their stamps replaced by when they were received."""
    return [
        dataclasses.replace(t, stored_ms=receipts.at.get(t.msg_id, t.stored_ms)) for t in triggers
    ]


def earliness(triggers: list[Trigger], receipts: Receipts) -> list[float]:
    """Per received trigger, how long before its due instant it arrived (negative: after)."""
    return [t.due_ms - receipts.at[t.msg_id] for t in triggers if t.msg_id in receipts.at]


@pytest.mark.cluster
@pytest.mark.timeout(300)
@needs_clockshift
async def test_replicas_never_fire_early_by_the_clock_they_follow_when_servers_disagree(
    tmp_path: Path,
) -> None:
    async with scene(tmp_path) as s:
        client, cluster = s.stores.client, s.cluster
        members = await lead(cluster, client, MEMBERS_STREAM, on=0)
        triggers = await lead(cluster, client, TRIGGER_STREAM, off=members)
        await s.wait_all(True, "every replica ready")
        start = now_ms() + 1_000

        # 1. The trigger stream's leader 5 s ahead: stamps off, firing on time.
        cluster.set_clock(triggers, 5.0)
        phase = now_ms() + 500
        await wait_until_ms(phase + 4_000, what="triggers stamped 5 s ahead")
        cluster.set_clock(triggers, 0)
        stamped = [t for t in await s.stored(phase) if t.msg_id in s.receipts.at]
        assert len(stamped) >= 20
        drift = sorted(t.stored_ms - s.receipts.at[t.msg_id] for t in stamped)
        assert 4_500 < drift[len(drift) // 2] < 5_500, drift  # stamps ahead, firing on time
        assert max(earliness(stamped, s.receipts)) <= EARLY_TOLERANCE_MS
        assert await s.all_beats(True), await s.beats()

        # 2. The members leader 0.6 s ahead: replicas follow it, early by at most that.
        skew_start = now_ms()  # from here until they are back at 0, ticks may be early
        cluster.set_clock(members, SKEW_S)

        async def following() -> bool:
            beats = await s.beats()
            return all(
                n in beats and beats[n].ready and abs(beats[n].offset_ms - SKEW_S * 1000) < 100
                for n in s.fleet.nodes
            )

        await wait_for_async(following, timeout=30, interval=0.1, message="offsets at +0.6 s")
        followed_from = now_ms() + 1_000
        await wait_until_ms(followed_from + 4_000, what="ticks on a members leader 0.6 s ahead")
        followed_until = now_ms()
        cluster.set_clock(members, 0)
        await wait_for_async(
            lambda: _offsets_near_zero(s), timeout=30, interval=0.1, message="offsets back at 0"
        )
        skew_end = now_ms() + 1_000  # a tick fired on the last sample of the old offset
        followed = [t for t in await s.stored(followed_from) if t.due_ms < followed_until]
        early = earliness(followed, s.receipts)
        assert len(early) >= 20
        assert max(early) <= SKEW_S * 1000 + EARLY_TOLERANCE_MS  # never early on its clock
        assert sorted(early)[len(early) // 2] > SKEW_S * 1000 / 2  # they did follow it

        # 3. The members leader 5 s ahead, beyond max_clock_skew: fail closed, then fire again.
        await _fail_closed_while(s, members, 5.0)
        # 4. The members leader stepped 30 s ahead, then set right: by its clock every tick
        # due meanwhile is past its 20 s window at once; no replica trusts that clock, so
        # none is given up, and they fire late once it is right (the audit below finds none
        # missing). Then stepped 30 s back: the same.
        await _fail_closed_while(s, members, 30.0)
        await _fail_closed_while(s, members, -30.0)

        # 5. The trigger stream's leader stepped 30 s back: stamps 30 s early, firing on time.
        cluster.set_clock(triggers, -30.0)
        phase = now_ms() + 500
        await wait_until_ms(phase + 3_000, what="triggers stamped 30 s behind")
        cluster.set_clock(triggers, 0)
        stamped = [t for t in await s.stored(phase) if t.msg_id in s.receipts.at]
        drift = sorted(t.stored_ms - s.receipts.at[t.msg_id] for t in stamped)
        assert stamped and -30_500 < drift[len(drift) // 2] < -29_500, drift
        assert max(earliness(stamped, s.receipts)) <= EARLY_TOLERANCE_MS

        # The whole run by true publish time; phase 2 allowed its 0.6 s.
        await wait_until_ms(now_ms() + 3_000, what="ticks after the last fault")
        end = now_ms() - 1_000
        everything = by_receipt(await s.stored(start), s.receipts)
        outside = [t for t in everything if not skew_start <= t.due_ms < skew_end]
        strict = check(outside, JOBS, (start, end))
        allowed = check(everything, JOBS, (start, end), early_tolerance_ms=SKEW_S * 1000 + 50)
        assert allowed.ok, allowed.table()
        assert _only_skewed_gaps(strict, skew_start, skew_end), strict.table()
        assert allowed.ticks >= len(JOBS) * 20  # over 20 s of ticks, each audited


async def _offsets_near_zero(s: Scene) -> bool:
    beats = await s.beats()
    return all(
        n in beats and beats[n].ready and abs(beats[n].offset_ms) < 100 for n in s.fleet.nodes
    )


async def _fail_closed_while(s: Scene, members: int, offset_s: float) -> None:
    """Members leader ``offset_s`` off: no replica ready, nothing fired early by a true clock
    or at all once every replica said so; ready again once set right."""
    s.cluster.set_clock(members, offset_s)
    await s.wait_all(False, f"every replica not ready, members leader {offset_s:+g} s", "clock is")
    closed = now_ms()
    await wait_until_ms(closed + 3_000, what=f"replicas closed, members leader {offset_s:+g} s")
    fired = [m for m, at in s.receipts.since(closed).items() if at < now_ms()]
    s.cluster.set_clock(members, 0)
    assert fired == [], f"fired while every replica was not ready: {fired}"
    await s.wait_all(True, "every replica ready again")


def _only_skewed_gaps(verdict: Verdict, skew_start: float, skew_end: float) -> bool:
    """The strict verdict, with phase 2's ticks left out, finds nothing but those gaps."""
    return all(v.kind == MISSING and skew_start <= v.due_ms < skew_end for v in verdict.violations)


# The chaos world's server clock fault, bounded for make test: the members leader off by more
# than max_clock_skew ahead, stepped back 30 s, and behind by less than the skew, with the
# trigger stream led elsewhere; every tick of the run audited by its stamps.
BOUNDED = Timings(duplicate_window=60.0, max_lateness=15.0)


@pytest.mark.cluster
@pytest.mark.timeout(300)
@needs_clockshift
async def test_the_chaos_server_clock_fault_loses_doubles_and_hastens_nothing(
    tmp_path: Path,
) -> None:
    async with chaos_world(
        tmp_path, BOUNDED, faketime=False, span_s=60.0, server_clocks=True
    ) as run:
        w = run.world
        cluster, client = w.cluster, run.client
        members = await lead(cluster, client, MEMBERS_STREAM, on=1)
        faults = [
            await shift_server_clock(w, client, members, 5.0, 4.0),
            await shift_server_clock(w, client, members, -30.0, 4.0),
            await shift_server_clock(w, client, members, -0.8, 4.0),
        ]
        kinds = await judged(run, min_ticks=200)
        assert kinds == {SERVER_CLOCK}
        for fault in faults:
            assert fault.target == cluster.names[members]
            assert "members leader on it" in fault.detail, fault.detail
            assert "moved onto it" not in fault.detail, fault.detail
