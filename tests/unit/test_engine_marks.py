"""Progress marks: a follower reads its owner's marks instead of acting on a live owner's ticks.

What a mark says of a tick is a pure table (:class:`MarksHeard`); the engine tests run three
replicas on the in-memory stores and virtual time, with an owner that is slow but live, and
one that then falls silent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from harness.memory_cluster import FAST, Cluster, every_second, now_ms, second_after
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryTriggers
from hrwcron.core import hrw
from hrwcron.engine.marks import BUSY, DONE, UNKNOWN, Mark, MarksHeard
from hrwcron.engine.ports import Published

STEP = 1.0
LEASE = 2.0


class Clock:
    def __init__(self) -> None:
        self.mono = 100.0

    def __call__(self) -> float:
        return self.mono


def mark(resolved_ms: int = 10_000, resolved: int = 5, revision: int = 7, instance: str = "i1"):
    return Mark(
        node="a",
        instance=instance,
        resolved_ms=resolved_ms,
        resolved=resolved,
        jobs_revision=revision,
    )


def heard(live_instance: str = "i1") -> tuple[MarksHeard, Clock]:
    clock = Clock()
    marks = MarksHeard(
        step=STEP,
        lease=LEASE,
        monotonic=clock,
        live=lambda node, instance: node == "a" and instance == live_instance,
    )
    return marks, clock


@pytest.mark.parametrize(
    ("fire_ms", "revision", "age_s", "live_instance", "expected"),
    [
        (10_000, 7, 0.1, "i1", DONE),  # the mark reached the fire instant
        (9_000, 3, 0.1, "i1", DONE),  # an older version of the job is known to the owner too
        (10_001, 7, 0.1, "i1", BUSY),  # not yet reached, but the owner is live and advancing
        (10_000, 8, 0.1, "i1", UNKNOWN),  # the owner may not have this version of the job
        (10_000, 7, 0.6, "i1", UNKNOWN),  # older than half a step: the owner fell silent
        (10_000, 7, 0.1, "i2", UNKNOWN),  # another instance of the node is the member now
    ],
)
def test_what_a_mark_says_of_a_tick(
    fire_ms: int, revision: int, age_s: float, live_instance: str, expected: int
) -> None:
    marks, clock = heard(live_instance)
    marks.hear(mark())
    clock.mono += age_s
    assert marks.verdict("a", fire_ms, revision) == expected


def test_an_owner_that_stops_advancing_for_a_lease_is_no_longer_waited_for() -> None:
    marks, clock = heard()
    assert marks.hear(mark())
    for _ in range(int(LEASE / 0.25)):  # fresh marks, but the same mark, for a whole lease
        clock.mono += 0.25
        assert not marks.hear(mark())
        assert marks.verdict("a", 10_001, 7) == BUSY
    clock.mono += 0.25
    marks.hear(mark())
    assert marks.verdict("a", 10_001, 7) == UNKNOWN
    assert marks.silent("a")
    # Resolving more ticks, or reaching a later instant, is advancing again.
    assert marks.hear(mark(resolved=6))
    assert marks.verdict("a", 10_001, 7) == BUSY and not marks.silent("a")


def test_no_mark_and_no_owner_are_unknown() -> None:
    marks, _ = heard()
    assert marks.verdict("a", 1, 0) == UNKNOWN
    assert marks.verdict(None, 1, 0) == UNKNOWN
    assert marks.silent("a")


class SlowTriggers:
    """The owner's trigger stream as a slow store: one publish at a time, ``delay`` each."""

    def __init__(self, inner: MemoryTriggers, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.lock = asyncio.Lock()

    async def publish(
        self, subject: str, body: bytes, headers: Mapping[str, str], expected_last_seq: int
    ) -> Published:
        async with self.lock:
            await asyncio.sleep(self.delay)
            return await self.inner.publish(subject, body, headers, expected_last_seq)

    async def publish_many(
        self, writes: Sequence[tuple[str, bytes, dict[str, str], int]]
    ) -> list[asyncio.Future[Published]]:
        return [asyncio.ensure_future(self.publish(*write)) for write in writes]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


NODES = ["a", "b", "c"]


def owned_by(node: str, count: int) -> list[str]:
    names = (f"herd{i:03d}" for i in range(10_000))
    return [n for n in names if hrw.rank(n, NODES)[0] == node][:count]


async def test_a_live_owner_that_falls_behind_is_waited_for_not_piled_on(
    cluster: Cluster,
) -> None:
    """Every second the owner has 20 ticks due and publishes them one by one, the last well
    after its followers' turns. Its marks advance, so they wait: none reads a claim, none
    claims, every tick is the owner's own, once and in due order."""
    jobs = [every_second(name) for name in owned_by("a", 20)]
    start = await cluster.put(*jobs)
    replicas = {r.scheduler.node: r for r in await cluster.start_all(NODES)}
    owner = replicas["a"]
    owner.triggers.inner = SlowTriggers(cluster.triggers, delay=0.048)  # type: ignore[assignment]
    slowed = now_ms()
    end = second_after(slowed, 4)
    await cluster.run_until(jobs, end, timeout=30)
    assert cluster.violations(jobs, (start, end)) == ""
    after = [t for t in cluster.triggers_log() if t.due_ms > slowed + 1000]
    # The owner really was behind its followers' turns...
    assert max(t.lateness_ms for t in after) > FAST.failover_step * 1000 + FAST.claim_lease * 1000
    # ...and nobody piled on: every tick is the owner's first attempt, no claim was read.
    assert {(t.node, t.attempt) for t in after} == {("a", 1)}
    for node in ("b", "c"):
        reads = sum(replicas[node].claims.reads.values())
        busy = [o for o in replicas[node].recorder.decisions if o.outcome == "lock_busy"]
        assert (reads, busy) == (0, []), node


async def test_ticks_waiting_on_an_owner_that_falls_silent_are_fired_by_the_next(
    cluster: Cluster,
) -> None:
    """The owner is behind, its followers wait on its marks; then it loses NATS (no heartbeat,
    so not ready, so no marks). The waiting ticks and the later ones are fired by the next
    candidates, each exactly once."""
    jobs = [every_second(name) for name in owned_by("a", 20)]
    start = await cluster.put(*jobs)
    replicas = {r.scheduler.node: r for r in await cluster.start_all(NODES)}
    owner = replicas["a"]
    owner.triggers.inner = SlowTriggers(cluster.triggers, delay=0.06)  # type: ignore[assignment]

    def parked() -> bool:
        return any(r.scheduler._ticks.parked for n, r in replicas.items() if n != "a")

    await cluster.run_until(jobs, second_after(now_ms(), 1), timeout=30)
    deadline = asyncio.get_running_loop().time() + 10
    while not parked():
        assert asyncio.get_running_loop().time() < deadline, "no follower waited on the owner"
        await asyncio.sleep(0.05)
    owner.members.cut = True
    cut = now_ms()
    end = second_after(cut, 4)
    await cluster.run_until(jobs, end, timeout=30)
    assert cluster.violations(jobs, (start, end)) == ""
    taken = [t for t in cluster.triggers_log() if t.due_ms > cut + 2000]
    assert taken and {t.node for t in taken} <= {"b", "c"}


async def test_a_follower_spends_nothing_per_tick_and_still_knows_each_jobs_next_tick(
    cluster: Cluster,
) -> None:
    """Once its owner's marks arrive, a job sits parked on a follower: no heap entry and no
    outcome per tick, while status there still shows the job's next tick, from the mark."""
    jobs = [every_second(name) for name in owned_by("a", 10)]
    await cluster.put(*jobs)
    replicas = {r.scheduler.node: r for r in await cluster.start_all(NODES)}
    follower = replicas["b"]
    names = {job.name for job in jobs}

    def all_parked() -> bool:
        parked = follower.scheduler._ticks.parked.get("a", {})
        return names <= set(parked)

    await cluster.run_until(jobs, second_after(now_ms(), 1))
    deadline = asyncio.get_running_loop().time() + 10
    while not all_parked():
        assert asyncio.get_running_loop().time() < deadline, "the follower never parked them"
        await asyncio.sleep(0.05)
    decided = len(follower.recorder.decisions)
    heap = [entry for entry in follower.scheduler._timer.heap if entry[2] in names]
    end = second_after(now_ms(), 3)
    await cluster.run_until(jobs, end)
    assert len(follower.recorder.decisions) == decided  # three seconds of ticks: nothing
    live = [e for e in heap if follower.scheduler.jobs[e[2]].entry == e[3]]
    assert live == []  # no heap entry stands for a parked job
    for job in jobs:
        shown = follower.scheduler.progress(job.name).next_due
        owner_knows = replicas["a"].scheduler.jobs[job.name].due
        assert shown is not None and owner_knows is not None
        assert abs(shown - owner_knows) <= 1000, (job.name, shown, owner_knows)
        assert shown > end - 2000


async def test_a_fleet_halfway_through_an_upgrade_to_marks_fires_every_tick_once(
    cluster: Cluster,
) -> None:
    """One replica of the version before marks (it follows the stream and announces nothing)
    beside two that are quiet: each tick still fires exactly once, and once the old one is
    stopped, the others take its jobs over."""
    jobs = [every_second(f"mixed{i:02d}") for i in range(24)]
    start = await cluster.put(*jobs)
    await cluster.start("a", marks=False)
    await cluster.start_all(["b", "c"])
    middle = second_after(now_ms(), 3)
    await cluster.run_until(jobs, middle)
    assert cluster.violations(jobs, (start, middle)) == ""
    assert "a" in {t.node for t in cluster.triggers_log()}  # the old one owned some jobs
    await cluster.stop("a")
    stopped = now_ms()
    end = second_after(stopped, 3)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start, end)) == ""
    assert {t.node for t in cluster.triggers_log() if t.stored_ms > stopped} <= {"b", "c"}


async def test_hundreds_of_parked_jobs_are_released_in_slices_and_none_is_lost(
    cluster: Cluster,
) -> None:
    """More jobs parked on one owner than one slice releases: when the owner stops, every
    one of them is taken over, each tick once."""
    jobs = [every_second(name) for name in owned_by("a", 300)]
    start = await cluster.put(*jobs)
    replicas = {r.scheduler.node: r for r in await cluster.start_all(NODES)}
    names = {job.name for job in jobs}

    def parked_on_a() -> int:
        return sum(
            len(names & set(replicas[n].scheduler._ticks.parked.get("a", {}))) for n in ("b", "c")
        )

    deadline = asyncio.get_running_loop().time() + 10
    while parked_on_a() < 2 * len(jobs):
        assert asyncio.get_running_loop().time() < deadline, parked_on_a()
        await asyncio.sleep(0.05)
    await cluster.stop("a")
    stopped = now_ms()
    end = second_after(stopped, 3)
    await cluster.run_until(jobs, end, timeout=30)
    assert cluster.violations(jobs, (start, end)) == ""
    assert {t.node for t in cluster.triggers_log() if t.stored_ms > stopped} <= {"b", "c"}


async def test_an_owner_whose_timer_stood_still_counts_none_of_the_ticks_others_fired_missed(
    cluster: Cluster,
) -> None:
    """The owner's timer stops (as in a paused process) while its heartbeat goes on: its mark
    stops advancing, the followers fire its ticks, and when its timer runs again the ticks it
    held are long past their lateness window. Quiet, it never saw those triggers go by: it
    reads their subjects and counts none of them missed."""
    jobs = [every_second(name, max_lateness=1) for name in owned_by("a", 6)]
    start = await cluster.put(*jobs)
    replicas = {r.scheduler.node: r for r in await cluster.start_all(NODES)}
    owner = replicas["a"].scheduler
    await cluster.run_until(jobs, second_after(now_ms(), 1))
    (timer,) = [t for t in owner._tasks if t.get_name() == "timer"]
    timer.cancel()
    stopped = second_after(now_ms())
    # Every tick due in the next 3 s fired by a follower, and past its lateness by then.
    await cluster.run_until(jobs, stopped + 3000, timeout=15)
    taken = [t for t in cluster.triggers_log() if stopped < t.due_ms <= stopped + 3000]
    assert taken and {t.node for t in taken} <= {"b", "c"}
    owner._spawn(owner._timer.run(), "timer")
    end = second_after(now_ms(), 2)
    await cluster.run_until(jobs, end, timeout=15)
    assert cluster.violations(jobs, (start, end)) == ""
    missed = [d for d in replicas["a"].recorder.decisions if d.outcome == "missed"]
    assert missed == []
    assert owner.missed_recently.total(now_ms()) == 0
