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
