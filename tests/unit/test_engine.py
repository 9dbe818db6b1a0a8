"""The engine over the in-memory stores: several Scheduler instances in one event loop, sharing
the stores the way replicas share NATS. The stores are held to the JetStream adapters' behaviour
by tests/contract, so what holds here holds for the protocol, not just for this double.

Ticks are real seconds (the finest a schedule allows), so each test runs for a few seconds with
short heartbeat, TTL, failover and lease settings; timing bounds are loose where load can delay
a replica and exact where the protocol forbids something (acting before one's turn).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from dataclasses import replace
from typing import Any

import pytest

from harness import wait_for_async
from harness.memory_cluster import (
    FAST,
    Cluster,
    HangingClaims,
    Replica,
    every_second,
    now_ms,
    second_after,
)
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import (
    MemoryClaims,
    MemoryJobs,
)
from hrwcron.core import hrw
from hrwcron.core.model import ClaimRecord, JobSpec
from hrwcron.core.schedule import field_hash
from hrwcron.core.ticks import manual_claim_key

# --- exactly once -----------------------------------------------------------------------------


async def test_each_tick_fires_once_across_replicas(cluster: Cluster) -> None:
    jobs = [every_second(f"job{i:02d}") for i in range(30)]
    start = await cluster.put(*jobs)
    await cluster.start_all(["a", "b", "c"])
    end = second_after(now_ms(), 3)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start, end)) == ""
    # The work is shared, and whatever was stored before the first failover step was the
    # owner's: no other candidate may act that early.
    assert {t.node for t in cluster.triggers_log()} == {"a", "b", "c"}
    settled = [t for t in cluster.triggers_log() if t.due_ms >= end - 2000]
    early = [t for t in settled if t.lateness_ms < FAST.failover_step * 1000]
    assert early
    for t in early:
        assert hrw.rank(t.job, ["a", "b", "c"])[0] == t.node, t


async def test_stopped_replica_is_taken_over(cluster: Cluster) -> None:
    jobs = [every_second(f"job{i:02d}") for i in range(20)]
    start = await cluster.put(*jobs)
    await cluster.start_all(["a", "b", "c"])
    await cluster.run_until(jobs, second_after(now_ms()))
    owned_by_b = [j for j in jobs if hrw.rank(j.name, ["a", "b", "c"])[0] == "b"]
    assert owned_by_b, "the test needs b to own some jobs"
    await cluster.stop("b")
    stopped = now_ms()
    end = second_after(stopped, 3)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start, end)) == ""
    assert [t for t in cluster.triggers_log() if t.node == "b" and t.stored_ms > stopped] == []
    for job in owned_by_b:
        assert {t.node for t in cluster.of(job.name) if t.due_ms > stopped} <= {"a", "c"}


async def test_ranks_act_at_fire_plus_rank_steps(cluster: Cluster) -> None:
    step = FAST.failover_step
    nodes = ["a", "b", "c"]
    jobs = [every_second(f"job{i:02d}") for i in range(12)]
    await cluster.put(*jobs)
    replicas = {r.scheduler.node: r for r in await cluster.start_all(nodes)}
    # For each job, hang its owner (rank 1 must act one step late) or its owner and the first
    # candidate (rank 2 acts two steps late).
    expected_rank: dict[str, int] = {}
    for i, job in enumerate(jobs):
        order = hrw.rank(job.name, nodes)
        rank = 1 + i % 2
        for node in order[:rank]:
            replicas[node].claims.hung.add(job.name)
        expected_rank[job.name] = rank
    hung_at = now_ms()
    end = second_after(hung_at, 3)
    await cluster.run_until(jobs, end)
    for job in jobs:
        rank = expected_rank[job.name]
        actor = hrw.rank(job.name, nodes)[rank]
        for t in cluster.of(job.name):
            if t.due_ms <= hung_at + 1000:
                continue  # a tick in flight when the hang began
            assert t.node == actor, (job.name, t)
            # Never before its turn: the server-stored time is at or after fire + rank*step.
            assert t.lateness_ms >= rank * step * 1000 - 5, (job.name, rank, t.lateness_ms)
            # And at its turn, not the next one's.
            assert t.lateness_ms < (rank + 1) * step * 1000, (job.name, rank, t.lateness_ms)
    assert cluster.violations(jobs, (second_after(hung_at), end)) == ""


async def test_frozen_claim_holder_is_taken_over_and_fenced_when_it_wakes() -> None:
    """The owner claims a tick and freezes before publishing, for longer than the claim lease
    and the duplicate window. The next candidate takes the claim over and fires; when the
    owner wakes and publishes what it had prepared, only the subject-sequence fence is left to
    stop it, and it does."""
    cluster = Cluster(duplicate_window=0.3)
    try:
        job = every_second("frozen")
        start = await cluster.put(job)
        nodes = ["a", "b", "c"]
        replicas = {r.scheduler.node: r for r in await cluster.start_all(nodes)}
        owner, successor = hrw.rank(job.name, nodes)[:2]
        zombie = replicas[owner]
        zombie.triggers.held.add(job.name)
        await wait_for_async(
            lambda: job.name in zombie.triggers.frozen, timeout=10, message="owner froze"
        )
        due = zombie.triggers.frozen[job.name]
        # Let the others fire this tick and the next, well past the duplicate window.
        await cluster.run_until([job], due + 2000)
        zombie.triggers.gate.set()
        await wait_for_async(
            lambda: any(o.due_ms == due for o in zombie.recorder.decisions),
            timeout=10,
            message="the woken owner resolved its tick",
        )
        woke = [o.outcome for o in zombie.recorder.decisions if o.due_ms == due]
        assert woke == ["fenced"], woke
        end = second_after(now_ms(), 1)
        await cluster.run_until([job], end)
        assert cluster.violations([job], (start, end)) == ""
        taken = [t for t in cluster.of(job.name) if t.due_ms == due]
        assert [(t.node, t.attempt) for t in taken] == [(successor, 2)]
    finally:
        await cluster.stop_all()


# --- fail closed ------------------------------------------------------------------------------


async def test_replica_that_cannot_heartbeat_stops_claiming(cluster: Cluster) -> None:
    jobs = [every_second(f"job{i:02d}") for i in range(20)]
    start = await cluster.put(*jobs)
    replicas = {r.scheduler.node: r for r in await cluster.start_all(["a", "b", "c"])}
    await cluster.run_until(jobs, second_after(now_ms()))
    cut = replicas["c"]
    cut.members.cut = True
    cut_at = now_ms()
    # Not ready as soon as its heartbeat is too old, and reported so at its next refresh.
    await wait_for_async(
        lambda: not cut.scheduler.ready and cut.recorder.readiness_log[-1][0] is False,
        timeout=10,
        message="c reports not ready",
    )
    assert "heartbeat" in cut.scheduler.not_ready_reason
    end = second_after(now_ms(), 3)
    await cluster.run_until(jobs, end)
    # Nothing from c once its heartbeat is older than the TTL (it may finish a tick it had
    # started just before); everything fired by the others, exactly once.
    late = [t for t in cluster.triggers_log() if t.node == "c" and t.stored_ms > cut_at + 1000]
    assert late == []
    assert cluster.violations(jobs, (start, end)) == ""
    # It comes back when NATS does.
    cut.members.cut = False
    await wait_for_async(lambda: cut.scheduler.ready, timeout=10, message="c ready again")


# --- catchup, pause, live changes -------------------------------------------------------------


async def test_restart_after_outage_catches_up(cluster: Cluster) -> None:
    all_ticks = every_second("all", catchup="all")
    latest = every_second("latest", catchup="latest")
    start = await cluster.put(all_ticks, latest)
    await cluster.start_all(["a", "b"])
    await cluster.run_until([all_ticks, latest], second_after(now_ms()))
    await cluster.stop("a")
    await cluster.stop("b")
    last_before = max(t.due_ms for t in cluster.triggers_log())
    # An outage of every replica, several ticks long.
    await wait_for_async(
        lambda: now_ms() > last_before + 3500, timeout=10, message="outage of 3.5 s"
    )
    restart = now_ms()
    await cluster.start("a")
    end = second_after(now_ms(), 2)
    await cluster.run_until([all_ticks, latest], end)

    # catchup = "all": every missed tick, once.
    assert cluster.violations([all_ticks], (start, end)) == ""
    caught_up = [t.due_ms for t in cluster.of("all") if t.due_ms > last_before]
    assert caught_up[0] == last_before + 1000

    # catchup = "latest": only the newest missed tick fires, then the schedule goes on.
    after = [t.due_ms for t in cluster.of("latest") if t.due_ms > last_before]
    assert after[0] >= int(restart) // 1000 * 1000 - 1000, (after, restart)
    assert after[0] - last_before >= 3000
    assert after == list(range(after[0], end + 1, 1000))
    first = cluster.of("latest")[0].due_ms
    assert cluster.violations([latest], (first, last_before)) == ""
    assert cluster.violations([latest], (after[0], end)) == ""


async def test_paused_jobs_do_not_fire(cluster: Cluster) -> None:
    running, paused = every_second("running"), every_second("paused", paused=True)
    start = await cluster.put(running, paused)
    await cluster.start_all(["a", "b"])
    end = second_after(now_ms(), 2)
    await cluster.run_until([running], end)
    assert cluster.of("paused") == []
    assert cluster.violations([running], (start, end)) == ""
    # Resumed, it fires from then on, not the ticks it skipped while paused.
    resumed = await cluster.put(every_second("paused"))
    end = second_after(now_ms(), 2)
    await cluster.run_until([paused], end)
    assert min(t.due_ms for t in cluster.of("paused")) > resumed - 50
    assert cluster.violations([paused], (resumed, end)) == ""


async def test_job_added_live_does_not_fire_past_instants(cluster: Cluster) -> None:
    await cluster.start_all(["a", "b"])
    # Generous lateness: without the write-time rule its whole window would be "missed".
    late_starter = JobSpec(name="added", schedule="@every 1s", max_lateness=3600)
    hourly = JobSpec(name="hourly", schedule="@hourly", max_lateness=3600)
    added = await cluster.put(late_starter, hourly)
    end = second_after(now_ms(), 2)
    await cluster.run_until([late_starter], end)
    assert min(t.due_ms for t in cluster.of("added")) > added - 50
    assert cluster.violations([late_starter], (added, end)) == ""
    assert cluster.of("hourly") == []  # its last instant was before the job existed


async def test_H_fires_at_the_instants_hashed_from_the_job_name(cluster: Cluster) -> None:
    # Every second second, on the seconds whose parity the job's name picks.
    jobs = [JobSpec(name=f"pulse.{c}", schedule="H/2 * * * * *") for c in "abcd"]
    start = await cluster.put(*jobs)
    await cluster.start_all(["a", "b"])
    end = second_after(now_ms(), 4)
    await cluster.run_until(jobs, end)
    for job in jobs:
        parity = field_hash(job.name, "second") % 2
        fired = [t.due_ms // 1000 for t in cluster.of(job.name)]
        assert len(fired) >= 2 and all(s % 2 == parity for s in fired), (job.name, fired)
    assert {field_hash(job.name, "second") % 2 for job in jobs} == {0, 1}
    assert cluster.violations(jobs, (start, end)) == ""


async def test_manual_trigger_does_not_fence_scheduled_ticks(cluster: Cluster) -> None:
    job = every_second("manual-ok")
    start = await cluster.put(job)
    replicas = await cluster.start_all(["a", "b"])
    await cluster.run_until([job], second_after(now_ms()))
    # Fired from the replica that is not the owner, between two ticks, twice with one id.
    other = next(r for r in replicas if hrw.rank(job.name, ["a", "b"])[0] != r.scheduler.node)
    # Its due lies ahead of the next scheduled ticks: were it taken as the job's watermark,
    # those ticks would look done and be fenced off.
    msg_id, due = f"{job.name}:manual:1", second_after(now_ms(), 3)
    key = manual_claim_key(job.name, "1")
    outcome = await other.scheduler.publish_unscheduled(job.name, msg_id, due, "manual", key)
    assert outcome == "started"
    again = await other.scheduler.publish_unscheduled(job.name, msg_id, due, "manual", key)
    assert again == "duplicate"
    end = second_after(now_ms(), 3)
    await cluster.run_until([job], end)
    manual = [t for t in cluster.triggers_log() if t.msg_id == msg_id]
    assert len(manual) == 1 and manual[0].kind == "manual"
    assert cluster.violations([job], (start, end)) == ""
    counts = [o.outcome for r in cluster.replicas.values() for o in r.recorder.decisions]
    assert "fenced" not in counts


async def test_bad_manual_trigger_names_the_job(cluster: Cluster) -> None:
    replica = await cluster.start("a")
    with pytest.raises(Exception, match="nope"):
        await replica.scheduler.publish_unscheduled(
            "nope", "nope:manual:1", 1, "manual", manual_claim_key("nope", "1")
        )
    assert cluster.triggers.messages == []


class SlowCountingClaims(HangingClaims):
    """Creates that take a little while, counting how many are in flight at once."""

    def __init__(self, inner: MemoryClaims) -> None:
        super().__init__(inner)
        self.in_flight = 0
        self.peak = 0

    async def create(self, key: str, record: ClaimRecord, ttl: float) -> int | None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.005)
            return await self.inner.create(key, record, ttl)
        finally:
            self.in_flight -= 1


async def test_a_herd_beyond_max_in_flight_queues_and_every_tick_fires(cluster: Cluster) -> None:
    jobs = [every_second(f"herd{i:02d}") for i in range(40)]
    start = await cluster.put(*jobs)
    replica = await cluster.start("a", max_in_flight=3)
    counting = SlowCountingClaims(cluster.claims)
    replica.scheduler._dispatcher.claims = counting
    end = second_after(now_ms(), 2)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start, end)) == ""
    # 40 ticks due at once went through three at a time, and the queue kept all three busy.
    assert counting.peak == 3
    assert not replica.scheduler._queued_acts


class JobsView:
    """One replica's view of the shared jobs bucket, counting the watches it opens."""

    def __init__(self, inner: MemoryJobs) -> None:
        self.inner = inner
        self.watches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SilencedJobs(JobsView):
    """The jobs bucket as a replica sees it when its first watch falls silent after the
    initial load, as a KV watch can after a server restart; later watches work."""

    async def watch(self, lanes: Collection[str] | None = None) -> AsyncIterator[Any]:
        self.watches += 1
        silent = self.watches == 1
        async for event in self.inner.watch(lanes):
            if event is None or not silent:
                yield event
            # a silent watch swallows every change after its initial state


async def test_a_silent_jobs_watch_is_restarted(cluster: Cluster) -> None:
    jobs = SilencedJobs(cluster.jobs)
    replica = await cluster.start("a", jobs=jobs, jobs_watch_check=0.2)
    late = every_second("added-while-silent")
    await cluster.put(late)
    await wait_for_async(
        lambda: late.name in replica.scheduler.jobs, timeout=5, message="the new job reached it"
    )
    assert jobs.watches == 2


class GappedJobs(JobsView):
    """A jobs bucket whose newest revision has no message any more (a removed delete
    marker): the watch can never deliver it."""

    def __init__(self, inner: MemoryJobs) -> None:
        super().__init__(inner)
        self.revision_reads = 0

    async def last_revision(self) -> int:
        self.revision_reads += 1
        return await self.inner.last_revision() + 1

    def watch(self, lanes: Collection[str] | None = None) -> AsyncIterator[Any]:
        self.watches += 1
        return self.inner.watch(lanes)


async def test_a_gap_the_watch_cannot_fill_does_not_restart_it(cluster: Cluster) -> None:
    jobs = GappedJobs(cluster.jobs)
    await cluster.put(every_second("present"))
    replica = await cluster.start("a", jobs=jobs, jobs_watch_check=0.1)
    await wait_for_async(
        lambda: jobs.revision_reads > 6, timeout=5, message="six checks by the guard"
    )
    assert "present" in replica.scheduler.jobs
    assert jobs.watches == 1


# --- a claim held by another replica ----------------------------------------------------------


async def freeze_owner(cluster: Cluster, job: JobSpec, nodes: list[str]) -> tuple[Replica, int]:
    """The job's owner claims a tick and then hangs before publishing it; returns the owner
    and the due instant it froze on."""
    replicas = {r.scheduler.node: r for r in await cluster.start_all(nodes)}
    owner = replicas[hrw.rank(job.name, nodes)[0]]
    owner.triggers.held.add(job.name)
    await wait_for_async(
        lambda: job.name in owner.triggers.frozen, timeout=10, message="owner froze"
    )
    return owner, owner.triggers.frozen[job.name]


async def test_a_live_holder_is_waited_for_not_polled() -> None:
    """While the claim's holder is live and ready, the others read its claim once when their
    turn comes and then wait, until the lease runs out: no read every quarter second."""
    cluster = Cluster()
    try:
        job = every_second("held", max_lateness=30)
        await cluster.put(job)
        nodes = ["a", "b", "c"]
        owner, due = await freeze_owner(cluster, job, nodes)
        for r in cluster.replicas.values():
            r.scheduler.settings = replace(r.scheduler.settings, claim_lease=3.0)
        await cluster.run_until([job], due)
        taken = [t for t in cluster.of(job.name) if t.due_ms == due]
        assert [(t.node != owner.scheduler.node, t.attempt) for t in taken] == [(True, 2)]
        key = f"{job.name}.{due}"
        reads = {
            node: r.claims.reads.get(key, 0)
            for node, r in cluster.replicas.items()
            if r is not owner
        }
        # One read when the create lost, one when the lease ran out: polling every 250 ms
        # for the 3 s lease would be a dozen.
        assert all(count <= 3 for count in reads.values()), reads
        owner.triggers.gate.set()
    finally:
        await cluster.stop_all()


async def test_a_silent_holder_is_taken_over_at_once() -> None:
    """The holder stops heartbeating right after claiming: its claim is taken over as soon as
    a failover turn finds it silent, not after the (here hour-long) claim lease."""
    cluster = Cluster()
    try:
        job = every_second("silent", max_lateness=30)
        start = await cluster.put(job)
        nodes = ["a", "b", "c"]
        owner, due = await freeze_owner(cluster, job, nodes)
        for r in cluster.replicas.values():
            r.scheduler.settings = replace(r.scheduler.settings, claim_lease=3600.0)
        owner.members.cut = True
        await cluster.run_until([job], due, timeout=10)
        taken = [t for t in cluster.of(job.name) if t.due_ms == due]
        assert [(t.node != owner.scheduler.node, t.attempt) for t in taken] == [(True, 2)]
        end = second_after(now_ms(), 1)
        await cluster.run_until([job], end, timeout=10)
        owner.triggers.gate.set()
        assert cluster.violations([job], (start, end)) == ""
    finally:
        await cluster.stop_all()


async def test_a_claim_of_a_replica_that_left_is_taken_over_at_once() -> None:
    """The holder leaves the membership (stopped, its publish never came) and a new instance
    of the same node joins: the old instance's claim is taken over at once."""
    cluster = Cluster()
    try:
        job = every_second("left", max_lateness=30)
        start = await cluster.put(job)
        nodes = ["a", "b", "c"]
        owner, due = await freeze_owner(cluster, job, nodes)
        for r in cluster.replicas.values():
            r.scheduler.settings = replace(r.scheduler.settings, claim_lease=3600.0)
        node = owner.scheduler.node
        await cluster.stop(node)
        await cluster.start(node, claim_lease=3600.0)
        await cluster.run_until([job], due, timeout=10)
        taken = [t for t in cluster.of(job.name) if t.due_ms == due]
        assert [t.attempt for t in taken] == [2]
        end = second_after(now_ms(), 1)
        await cluster.run_until([job], end, timeout=10)
        assert cluster.violations([job], (start, end)) == ""
    finally:
        await cluster.stop_all()
