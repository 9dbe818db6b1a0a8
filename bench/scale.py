"""Scale: J hourly jobs spread over the hour by jitter, on 3 replicas started together: time to
ready, resident memory, idle CPU, the owned-job recount after a membership change, and the
longest event-loop stall seen by a probe inside each replica.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from hrwcron.core.model import JobSpec

from . import telemetry_growth
from .common import Deployment, Replica, cpu_seconds, put_jobs, rss_mb, stores_for, until

JITTER_S = 3600.0


@dataclass
class ReplicaFigures:
    node: str
    ready_s: float = math.nan
    rss_mb: float = math.nan
    idle_cpu_pct: float = math.nan
    # Longest late wake-up of the loop probe, wall clock and the part spent computing, from
    # boot until ready (plus settling), and afterwards (idle, leave, join).
    stall_start_ms: float = math.nan
    busy_start_ms: float = math.nan
    stall_steady_ms: float = math.nan
    busy_steady_ms: float = math.nan


@dataclass
class Recount:
    change: str  # "leave" or "join"
    node: str
    took_ms: float
    owned: int


@dataclass
class ScaleResult:
    jobs: int
    deployment: str
    put_s: float = math.nan
    idle_window_s: float = 0.0
    replicas: list[ReplicaFigures] = field(default_factory=list)
    recounts: list[Recount] = field(default_factory=list)
    nats_rss_mb: float = math.nan
    # Telemetry of one replica once every job has ticked (MB added), per-job metrics on / off.
    growth_mb: dict[bool, float] = field(default_factory=dict)

    @property
    def ticks_per_s(self) -> float:
        return self.jobs / JITTER_S


def _max_lag(replica: Replica, since: float, until_t: float, key: str = "max_ms") -> float:
    lags = [
        e.data[key] for e in replica.poll() if e.kind == "lag" and since <= e.t <= until_t + 1.5
    ]
    return max(lags) if lags else math.nan


async def run(dep: Deployment, jobs: int, idle_s: float, log: object) -> ScaleResult:
    import time

    result = ScaleResult(jobs=jobs, deployment=dep.kind, idle_window_s=idle_s)
    config = dep.config()
    stores = await stores_for(config)
    fleet = dep.fleet("scale", BENCH_PROBE="1")
    try:
        specs = [JobSpec(name=f"s-{i}", schedule="@hourly", jitter=JITTER_S) for i in range(jobs)]
        result.put_s = await put_jobs(stores, specs, limit=512)
        log(f"  wrote {jobs} jobs in {result.put_s:.1f} s")  # type: ignore[operator]
        fleet.start(3)
        await fleet.wait_ready(timeout=300)
        figures = {r.node: ReplicaFigures(r.node) for r in fleet.members}
        for r in fleet.members:
            event = r.last("readiness")
            assert event is not None
            figures[r.node].ready_s = event.t - r.spawned_at
        nodes = [r.node for r in fleet.members]
        await fleet.wait_members(nodes)
        # The first owned-job count follows loading; wait for it so it is not timed as idle.
        await until(
            lambda: all(r.last("owned") is not None for r in fleet.members),
            timeout=120,
            what="the first owned-job count of every replica",
        )
        await asyncio.sleep(2.0)  # let start-up work (first recount, history) finish
        settled = time.time()
        for r in fleet.members:
            figures[r.node].stall_start_ms = _max_lag(r, r.spawned_at, settled)
            figures[r.node].busy_start_ms = _max_lag(r, r.spawned_at, settled, "busy_ms")
            figures[r.node].rss_mb = rss_mb(r.pid)
        # Idle CPU with the lag probe off: it wakes 100 times a second, which is not idle.
        for r in fleet.members:
            r.toggle_probe()
        before = {r.node: cpu_seconds(r.pid) for r in fleet.members}
        began = time.perf_counter()
        await asyncio.sleep(idle_s)
        spent = time.perf_counter() - began
        for r in fleet.members:
            figures[r.node].idle_cpu_pct = (cpu_seconds(r.pid) - before[r.node]) / spent * 100
            r.toggle_probe()
        steady_from = time.time()
        # Some steady state with the probe on, so the leaver has a figure too.
        await asyncio.sleep(3.0)
        with_rss = dep.server.pid if hasattr(dep.server, "pid") else None
        if with_rss:
            result.nats_rss_mb = rss_mb(with_rss)

        # Leave: a graceful stop deregisters at once, so both survivors see the change now.
        leaver = fleet.members[-1]
        survivors = fleet.members[:-1]
        marks = {r.node: len(r.poll()) for r in survivors}
        stall_leaver = _max_lag(leaver, steady_from, time.time())
        busy_leaver = _max_lag(leaver, steady_from, time.time(), "busy_ms")
        leaver.terminate()
        await fleet.wait_members(nodes[:-1])
        await until(
            lambda: all(_recount_after(r, marks[r.node]) for r in survivors),
            timeout=60,
            what="survivors to recount owned jobs after the leave",
        )
        for r in survivors:
            took, owned = _recount_after(r, marks[r.node])  # type: ignore[misc]
            result.recounts.append(Recount("leave", r.node, took, owned))
        # Join: the same node comes back; the survivors recount again.
        marks = {r.node: len(r.poll()) for r in survivors}
        leaver.start()
        await fleet.wait_ready([leaver], timeout=300)
        await fleet.wait_members(nodes)
        await until(
            lambda: all(_recount_after(r, marks[r.node]) for r in survivors),
            timeout=60,
            what="survivors to recount owned jobs after the join",
        )
        for r in survivors:
            took, owned = _recount_after(r, marks[r.node])  # type: ignore[misc]
            result.recounts.append(Recount("join", r.node, took, owned))
        await asyncio.sleep(2.0)
        ended = time.time()
        for r in survivors:
            figures[r.node].stall_steady_ms = _max_lag(r, steady_from, ended)
            figures[r.node].busy_steady_ms = _max_lag(r, steady_from, ended, "busy_ms")
        figures[leaver.node].stall_steady_ms = stall_leaver
        figures[leaver.node].busy_steady_ms = busy_leaver
        result.replicas = [figures[n] for n in nodes]
        for f in result.replicas:
            log(  # type: ignore[operator]
                f"  {f.node}: ready {f.ready_s:.1f} s, {f.rss_mb:.0f} MB, idle "
                f"{f.idle_cpu_pct:.1f}% CPU, stall {f.stall_start_ms:.0f} ({f.busy_start_ms:.0f} "
                f"computing) ms at start-up, {f.stall_steady_ms:.0f} ({f.busy_steady_ms:.0f}) after"
            )
        for c in result.recounts:
            log(f"  recount after {c.change} on {c.node}: {c.took_ms:.0f} ms")  # type: ignore[operator]
    finally:
        fleet.stop()
        await stores.client.close()
    for per_job in (True, False):
        found = await asyncio.to_thread(telemetry_growth.measure, jobs, per_job)
        result.growth_mb[per_job] = found["after_mb"] - found["before_mb"]
    log(  # type: ignore[operator]
        f"  telemetry after every job ticked once: +{result.growth_mb[True]:.0f} MB "
        f"(per-job metrics), +{result.growth_mb[False]:.0f} MB (without)"
    )
    return result


def _recount_after(replica: Replica, mark: int) -> tuple[float, int] | None:
    """The first owned-count after a membership change reported past ``mark``."""
    seen_change = False
    for event in replica.poll()[mark:]:
        if event.kind == "membership":
            seen_change = True
        elif event.kind == "owned" and seen_change and event.data["since_membership_ms"]:
            return float(event.data["since_membership_ms"]), int(event.data["count"])
    return None
