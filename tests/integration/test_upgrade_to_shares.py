"""The upgrade to holding shares on a real nats-server, as docs/running.md tells operators to do
it: replicas of this version run on a jobs bucket an earlier version wrote (jobs under their
bare names, no layout marker), ``hrwcron provision --migrate`` moves the jobs to their lanes
while they fire, and the replicas are restarted one at a time with ``holders = 2``. Every
tick of every job fires once, in order, never early, all the way through."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import AsyncIterator

import pytest

from harness import live_keys, wait_for_async
from harness.inprocess_replicas import Cluster
from hrwcron.cli.provision import migrate_jobs
from hrwcron.core import partitions
from hrwcron.core.model import JobSpec
from hrwcron.core.ticks import TickId

NODES = ("a", "b", "c")
JOBS = [f"upgrade.j{i:02d}" for i in range(24)]
DEADLINE = 30.0


@pytest.fixture
async def legacy_cluster(nats_url: str) -> AsyncIterator[Cluster]:
    """Three replicas (every one holding every job) on a bucket without lanes."""
    seed = await Cluster.start(nats_url, {"seed": {}})  # provisions the buckets and stream
    kv = await seed.client.jetstream().key_value("hrwcron_jobs")
    await kv.purge(partitions.LAYOUT_KEY)  # as an earlier version created it
    await seed.stop()
    cluster = await Cluster.start(nats_url, {node: {} for node in NODES})
    yield cluster
    await cluster.stop()


async def stored_keys(cluster: Cluster) -> set[str]:
    keys = await live_keys(cluster.client, "hrwcron_jobs")
    return {key for key in keys if key != partitions.LAYOUT_KEY}


async def test_a_rolling_upgrade_to_shares_fires_every_tick_once(
    legacy_cluster: Cluster,
) -> None:
    cluster = legacy_cluster
    for name in JOBS:
        await cluster.admin.put_job(JobSpec(name=name, schedule="@every 1s"))
    assert await stored_keys(cluster) == set(JOBS)  # bare names: what the old replicas read
    began_ms = time.time() * 1000

    async def fired() -> int:
        """Triggers stored so far, of every job (one read, however many jobs)."""
        info = await cluster.client.jetstream().stream_info("HRWCRON_TRIGGERS")
        return int(info.state.messages)

    async def fired_since(before: int) -> bool:
        return await fired() >= before + 2 * len(JOBS)

    await wait_for_async(lambda: fired_since(0), timeout=DEADLINE, message="every job ticking")

    stores = next(iter(cluster.replicas.values())).stores
    line = await migrate_jobs(stores)
    assert str(len(JOBS)) in line, line
    assert await stored_keys(cluster) == {partitions.job_key(name, []) for name in JOBS}
    # A write through a replica started before the move lands in its lane too.
    edited = await cluster.admin.put_job(JobSpec(name=JOBS[0], schedule="@every 1s", payload=1))
    assert not edited.created
    assert await stored_keys(cluster) == {partitions.job_key(name, []) for name in JOBS}

    for node in NODES:
        await cluster.replicas.pop(node).stop()
        await cluster.add(node, holders=2)
        await cluster.wait_formed()
        before = await fired()
        await wait_for_async(
            functools.partial(fired_since, before),
            timeout=DEADLINE,
            interval=0.2,
            message=f"ticking after {node} restarted",
        )

    # Every replica now holds a share, and none holds every job.
    held = {node: len(r.scheduler.jobs) for node, r in cluster.replicas.items()}
    assert all(0 < count < len(JOBS) for count in held.values()), held
    assert sum(held.values()) == 2 * len(JOBS)
    ended_ms = time.time() * 1000 - 2_000  # ticks due later may still be on their way

    for name in JOBS:
        records = await cluster.stored(name)
        scheduled = [(TickId.parse(r.msg_id).due_ms, r) for r in records]
        dues = [due for due, _ in scheduled]
        assert len(dues) == len(set(dues)), f"{name}: a tick fired twice"
        assert dues == sorted(dues), f"{name}: out of order"
        gaps = [b - a for a, b in itertools.pairwise(dues)]
        assert set(gaps) == {1000}, f"{name}: ticks missing ({gaps})"
        assert dues[0] <= began_ms + 2_000 and dues[-1] >= ended_ms, name
        early = [r.msg_id for due, r in scheduled if r.stored_ms < due]
        assert not early, f"{name}: fired early {early}"
