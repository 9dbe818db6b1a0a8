"""Holding shares (scheduler.holders): each replica holds only its lanes' jobs, and every tick
still fires exactly once while replicas join, leave and jobs move between lanes."""

from __future__ import annotations

from collections.abc import Iterable

from harness import wait_for_async
from harness.memory_cluster import Cluster, every_second, now_ms, second_after
from hrwcron.core import partitions
from hrwcron.core.model import JobSpec
from hrwcron.core.turns import Candidate

HOLDERS = 2


def expected_holding(jobs: Iterable[JobSpec], nodes: list[str]) -> dict[str, set[str]]:
    """Which jobs each node should hold with ``nodes`` live and ready."""
    by_lane = partitions.holders_by_lane([Candidate(n, 1.0, frozenset()) for n in nodes], HOLDERS)
    held: dict[str, set[str]] = {n: set() for n in nodes}
    for job in jobs:
        lane = partitions.lane_of(job.name, job.tags)
        for node in nodes if lane == partitions.TAGGED else by_lane[lane]:
            held[node].add(job.name)
    return held


async def start(cluster: Cluster, nodes: list[str]) -> None:
    for node in nodes:
        await cluster.start(node, holders=HOLDERS, tags=("any",))


async def holding_settles(cluster: Cluster, jobs: list[JobSpec], nodes: list[str]) -> None:
    want = expected_holding(jobs, nodes)

    def settled() -> bool:
        return all(
            set(cluster.replicas[n].scheduler.jobs) == want[n]
            and not cluster.replicas[n].scheduler._table.catching_up
            for n in nodes
        )

    await wait_for_async(settled, timeout=15, message=f"{nodes} hold their lanes' jobs")


async def test_each_replica_holds_its_lanes_and_every_tick_fires_once(cluster: Cluster) -> None:
    jobs = [every_second(f"job{i:02d}") for i in range(40)] + [every_second("tagged", tags=["any"])]
    start_ms = await cluster.put(*jobs)
    nodes = ["a", "b", "c", "d"]
    await start(cluster, nodes)
    await holding_settles(cluster, jobs, nodes)
    held = {n: len(cluster.replicas[n].scheduler.jobs) for n in nodes}
    assert all(count < len(jobs) for count in held.values()), held  # a share, not everything
    assert all("tagged" in cluster.replicas[n].scheduler.jobs for n in nodes)
    end = second_after(now_ms(), 3)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start_ms, end)) == ""


async def test_a_stopped_holder_is_replaced_and_no_tick_is_lost(cluster: Cluster) -> None:
    jobs = [every_second(f"job{i:02d}") for i in range(40)]
    start_ms = await cluster.put(*jobs)
    await start(cluster, ["a", "b", "c"])
    await holding_settles(cluster, jobs, ["a", "b", "c"])
    await cluster.run_until(jobs, second_after(now_ms()))
    await cluster.stop("c")
    # With two members left every lane is held by both of them.
    await holding_settles(cluster, jobs, ["a", "b"])
    end = second_after(now_ms(), 3)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start_ms, end)) == ""


async def test_a_joining_replica_takes_its_lanes_and_the_others_give_them_up(
    cluster: Cluster,
) -> None:
    jobs = [every_second(f"job{i:02d}") for i in range(40)]
    start_ms = await cluster.put(*jobs)
    await start(cluster, ["a", "b", "c"])
    await holding_settles(cluster, jobs, ["a", "b", "c"])
    await cluster.run_until(jobs, second_after(now_ms()))
    await start(cluster, ["d"])
    await holding_settles(cluster, jobs, ["a", "b", "c", "d"])
    end = second_after(now_ms(), 3)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start_ms, end)) == ""


async def test_a_job_that_gains_tags_moves_to_the_lane_everyone_holds(cluster: Cluster) -> None:
    jobs = [every_second(f"job{i:02d}") for i in range(12)]
    await cluster.put(*jobs)
    nodes = ["a", "b", "c"]
    await start(cluster, nodes)
    await holding_settles(cluster, jobs, nodes)
    moved = JobSpec(name="job00", schedule="@every 1s", tags=["any"])
    jobs[0] = moved
    await cluster.put(moved)
    await holding_settles(cluster, jobs, nodes)
    stored = await cluster.jobs.get("job00")
    assert stored is not None and stored.key == partitions.job_key("job00", ["any"])


def subjects_known(cluster: Cluster, node: str) -> set[str]:
    return set(cluster.replicas[node].scheduler.last)


def subjects_held(cluster: Cluster, node: str) -> set[str]:
    return {job.subject for job in cluster.replicas[node].scheduler.jobs.values()}


async def test_a_restarted_fleet_reads_only_its_shares_newest_triggers_and_fires_on(
    cluster: Cluster,
) -> None:
    jobs = [every_second(f"job{i:02d}", max_lateness=30) for i in range(40)]
    every_subject = {job.trigger_subject() for job in jobs}
    start_ms = await cluster.put(*jobs)
    nodes = ["a", "b", "c"]
    await start(cluster, nodes)
    await holding_settles(cluster, jobs, nodes)
    await cluster.run_until(jobs, second_after(now_ms()))
    for node in nodes:
        await cluster.stop(node)
    newest: dict[str, int] = {}
    for job in jobs:
        seen = await cluster.triggers.last(job.trigger_subject())
        assert seen is not None
        newest[job.name] = seen.watermark
    # Every newest trigger lies inside the lateness window: planned without reading it, a
    # replica would take that tick for one still to resolve.
    await start(cluster, nodes)
    for node in nodes:
        replica = cluster.replicas[node]
        assert replica.triggers.follows == 0, node  # never the whole stream
        for job in replica.scheduler.jobs.values():  # started: planned past the stream's
            assert job.due is not None and job.due > newest[job.spec.name], (node, job.spec.name)
    await holding_settles(cluster, jobs, nodes)
    # The first two held every lane until the third joined; the third read its share only.
    assert set(cluster.replicas["c"].triggers.read) < every_subject
    for node in nodes:
        assert subjects_known(cluster, node) <= subjects_held(cluster, node), node
    end = second_after(now_ms(), 3)
    await cluster.run_until(jobs, end)
    assert cluster.violations(jobs, (start_ms, end)) == ""
    decided_again = [
        d
        for r in cluster.replicas.values()
        for d in r.recorder.decisions
        if d.due_ms <= newest[d.job]
    ]
    assert decided_again == []


async def test_jobs_created_while_the_fleet_runs_fire_once_without_a_read_of_their_subjects(
    cluster: Cluster,
) -> None:
    """A job written after a replica began watching its lane has no trigger of its own ticks
    yet: it is planned at once, not after a read of its subject (a million new jobs would
    otherwise be a million reads). One deleted and written again under the same name finds its
    old triggers through the fence on its first publish, and fires each new tick once."""
    old = [every_second(f"job{i:02d}", max_lateness=30) for i in range(20)]
    start_ms = await cluster.put(*old)
    nodes = ["a", "b", "c"]
    await start(cluster, nodes)
    await holding_settles(cluster, old, nodes)
    await cluster.run_until(old, second_after(now_ms()))
    again = old[0]
    await cluster.jobs.delete(again.name, None)
    new = [every_second(f"new{i:02d}", max_lateness=30) for i in range(20)]
    read_before = {n: len(cluster.replicas[n].triggers.read) for n in nodes}
    created_ms = await cluster.put(*new, again)
    await holding_settles(cluster, old + new, nodes)
    end = second_after(now_ms(), 3)
    await cluster.run_until(old + new, end)
    for node in nodes:
        replica = cluster.replicas[node]
        assert replica.triggers.read[read_before[node] :] == [], node  # no subject read
    assert cluster.violations(old[1:], (start_ms, end)) == ""
    assert cluster.violations([*new, again], (created_ms, end)) == ""
    assert any(t.due_ms < created_ms for t in cluster.of(again.name))  # old triggers held
    fenced_reads = [s for r in cluster.replicas.values() for s in r.triggers.read_one]
    assert again.trigger_subject() in fenced_reads  # found by the fence, then read
