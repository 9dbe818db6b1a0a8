"""Power failures of NATS nodes under running replicas (part of ``make test``): with the
shipped ``sync_interval: always``, one node, a minority with a paused leader and every node
losing power leave every tick exactly once in the stream and every acknowledged trigger where
it was acknowledged. The long random runs (``make chaos``) mix these faults with all others."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.chaos import now_ms
from harness.power import SYNC_ALWAYS, PowerCluster, fuse_unavailable

from .faults import Timings, hold
from .power_cuts import (
    POWER_ALL,
    POWER_MINORITY,
    POWER_ONE,
    power_cut_all,
    power_cut_minority,
    power_cut_one,
)
from .world import chaos_world

# Every node off at once leaves the cluster without a majority until all have booted and
# elected leaders again (about 10 s here); ticks due meanwhile fire late, within this lateness.
POWER = Timings(duplicate_window=60.0, max_lateness=30.0)


@pytest.mark.cluster
@pytest.mark.skipif(
    fuse_unavailable() is not None, reason=f"FUSE unavailable: {fuse_unavailable()}"
)
async def test_bounded_power_loss(tmp_path: Path) -> None:
    async with chaos_world(tmp_path, POWER, faketime=False, power_sync=SYNC_ALWAYS) as run:
        w = run.world
        assert isinstance(w.cluster, PowerCluster)
        await power_cut_one(w, 1, 2.0)
        await power_cut_minority(w, 1.0, 4.0)
        await power_cut_all(w, 1.0)
        await power_cut_all(w, 0.2)  # at once again: recovery from a recovery
        await w.heal()
        verdict = await run.verdict(now_ms() - 1_000)
        print(verdict.table())
        for fault in w.faults:
            print(fault)
        assert verdict.ok, run.explain(verdict)
        assert [f.kind for f in w.faults] == [POWER_ONE, POWER_MINORITY, POWER_ALL, POWER_ALL]
        assert len(w.cluster.cuts) == 8
        acks = w.acks()
        # The journal is the record the lost-ack check stands on: it must cover the run.
        assert len({a.msg_id for a in acks}) >= verdict.ticks * 0.9
        assert verdict.ticks > 300


@pytest.mark.chaos
@pytest.mark.cluster
@pytest.mark.skipif(
    fuse_unavailable() is not None, reason=f"FUSE unavailable: {fuse_unavailable()}"
)
async def test_power_loss_of_one_node_or_a_minority(
    tmp_path: Path, chaos_seed: int, chaos_sync: str
) -> None:
    """Part of ``make chaos``: only the faults that leave a majority's data standing, eight of
    them, so what they lose shows apart from every node losing power. With ``SYNC=default``
    too: a loss here is what the default costs without a full outage."""
    rng = random.Random(chaos_seed)
    async with chaos_world(tmp_path, POWER, faketime=False, power_sync=chaos_sync) as run:
        w = run.world
        for _ in range(4):
            await power_cut_one(w, rng.randrange(3), rng.uniform(1.0, 4.0))
            await hold(2, "between power cuts")
            await power_cut_minority(w, 1.0, rng.uniform(3.0, 6.0), rng=rng)
            await hold(2, "between power cuts")
        await w.heal()
        verdict = await run.verdict(now_ms() - 1_000)
        print(f"sync_interval {chaos_sync}, seed {chaos_seed}:\n{verdict.table()}")
        for fault in w.faults:
            print(fault)
        assert verdict.ok, run.explain(verdict)
        assert len(w.acks()) > 500
