"""Faults between the NATS servers, bounded for ``make test``: a 3-node cluster whose routes go
through forwarders, three replicas connected to servers on both sides, and one after another a
split with the trigger stream's leader on the minority (cut), a split with it on the majority
(blackhole), a bridge, a one-way loss and a slow link, each healed; then every tick audited.

What each fault must show besides a clean stream: the forwarders really carried every route
(cutting a node leaves no route connection to it), the majority elected a new leader while the
old one sat on the minority, replicas were connected on both sides, and no replica went down.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.chaos import now_ms

from .faults import Timings
from .routes import (
    ROUTE_BRIDGE,
    ROUTE_KINDS,
    ROUTE_LATENCY,
    ROUTE_ONE_WAY,
    ROUTE_SPLIT,
    bridge,
    latency,
    one_way,
    split,
)
from .world import chaos_world, replicas_lost, tracebacks_in_full

SEED = 3
# Ticks wait through elections (nats-server waits 4-9 s before calling one; a one-way loss can
# keep leadership moving until it heals) and a failover step or two: 15 s in the runs so far.
ROUTES = Timings(duplicate_window=60.0, max_lateness=30.0)


@pytest.mark.cluster
@pytest.mark.timeout(300)  # five faults, each waiting for an election and for every stream
async def test_faults_between_nats_servers_lose_and_double_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    async with chaos_world(tmp_path, ROUTES, faketime=False, span_s=100.0, route_links=True) as run:
        w = run.world
        links = w.cluster.links
        assert links is not None
        for a, b in ((0, 1), (0, 2), (1, 2)):
            assert links.connections(a, b) > 0, f"no route n{a}-n{b} through the forwarders"
        faults = [
            await split(w, 6.0, leader_side="minority"),
            await split(w, 6.0, leader_side="majority", blackhole=True),
            await bridge(w, 6.0, via=rng.randrange(3)),
            await one_way(w, 6.0, *rng.sample(range(3), 2)),
            await latency(w, 8.0, *rng.sample(range(3), 2), delay_s=0.3, jitter_s=0.2),
        ]
        await w.heal()
        verdict = await run.verdict(now_ms() - 1_000)
        print(verdict.table())
        print("\n".join(str(f) for f in w.faults))
        assert verdict.ok, run.explain(verdict)
        lost = replicas_lost(w)
        assert lost == [], "\n".join(lost) + "\n\n" + tracebacks_in_full(w)
        assert [f.kind for f in faults] == [
            ROUTE_SPLIT,
            ROUTE_SPLIT,
            ROUTE_BRIDGE,
            ROUTE_ONE_WAY,
            ROUTE_LATENCY,
        ]
        assert {f.kind for f in faults} == set(ROUTE_KINDS)
        minority, majority = faults[0], faults[1]
        assert "on the minority" in minority.detail and "on the majority" in minority.detail
        assert "on the minority" in majority.detail, majority.detail
        # A cut leaves no route to the minority; the majority moved the leadership away.
        assert "; 0 route connections across" in minority.detail, minority.detail
        elected = minority.detail.split("majority elected ")[1].split()[0]
        assert elected != minority.target, minority.detail
        assert verdict.ticks > 500  # a lost or doubled tick would show
