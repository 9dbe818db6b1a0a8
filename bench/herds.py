"""Repeated herds: N jobs due together every 10 s on 3 replicas, in steady state.

One herd measures a burst; a herd that comes back every 10 s shows whether the fleet keeps up
or collapses: followers whose turns pass while a live owner is still working through the herd
used to claim and publish on top of it, which slowed the owner further. Measured per herd after
the jobs have settled: when the herd's last trigger was stored (against the pipelined floor for
as many messages, measured in the same run), publishes the stream refused as repeats, claim
operations and claims-bucket messages per trigger, and replica CPU per trigger.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import HEADER_WATERMARK

from .burst import CLAIM_OPS, PIPELINE_WINDOWS, _counters, _pipelined_floor
from .common import (
    Deployment,
    delete_jobs,
    fleet_cpu,
    fmt,
    last_seq,
    now_ms,
    put_jobs,
    ratio,
    read_stream,
    sleep_until,
    stores_for,
    until,
)

PERIOD_S = 10
LAST_GOAL_S = 1.0
CLAIM_MSGS_GOAL = 1.05


@dataclass
class Herd:
    due_ms: int
    triggers: int
    last_s: float
    repeats: float  # publishes the stream answered as duplicates
    claim_ops: float  # claim creates, reads and replaces, per trigger
    claim_messages: float  # messages stored in the claims bucket, per trigger
    cpu_us: float  # replica CPU per trigger, summed over the replicas


@dataclass
class HerdsResult:
    jobs: int
    settle_s: float
    floor_s: float = math.nan
    herds: list[Herd] = field(default_factory=list)

    @property
    def worst_last_s(self) -> float:
        return max((h.last_s for h in self.herds), default=math.nan)

    @property
    def worst_claim_messages(self) -> float:
        return max((h.claim_messages for h in self.herds), default=math.nan)

    @property
    def repeats(self) -> float:
        return sum(h.repeats for h in self.herds)


async def run(dep: Deployment, jobs: int, herds: int, settle_s: float, log: object) -> HerdsResult:
    result = HerdsResult(jobs=jobs, settle_s=settle_s)
    config = dep.config()
    stores = await stores_for(config)
    fleet = dep.fleet("herds")
    js = stores.client.jetstream()
    stream = config.scheduler.stream
    subjects = f"{config.scheduler.subject_prefix}.>"
    claims_stream = f"KV_{config.scheduler.claims_bucket}"
    specs = [
        JobSpec(name=f"h-{i}", schedule=f"*/{PERIOD_S} * * * * *", max_lateness=600.0)
        for i in range(jobs)
    ]
    try:
        floors = [(await _pipelined_floor(dep, jobs, w))[0] for w in PIPELINE_WINDOWS]
        result.floor_s = min(floors)
        fleet.start(3)
        await fleet.wait_ready(timeout=90)
        await fleet.wait_members([r.node for r in fleet.members])
        await put_jobs(stores, specs, limit=512)
        await asyncio.sleep(settle_s)  # herds fire meanwhile, uncounted: the steady state is
        for _ in range(herds):
            due_ms = (math.floor(now_ms() / 1000 / PERIOD_S) + 1) * PERIOD_S * 1000
            if due_ms - now_ms() < 2000:
                due_ms += PERIOD_S * 1000
            await sleep_until(due_ms - 1500)
            first_seq = await last_seq(js, stream) + 1
            claims_before = await last_seq(js, claims_stream)
            before = await _counters(fleet.members)
            await sleep_until(due_ms - 300)
            cpu_before = fleet_cpu(fleet.members)

            async def enough(first: int = first_seq) -> bool:
                return await last_seq(js, stream) - first + 1 >= jobs

            await until(enough, timeout=120, what=f"the herd due at {due_ms}", interval=0.2)
            deadline = now_ms() + 120_000
            while True:  # stragglers of the herd before may be among the first messages
                stored = await read_stream(js, stream, subjects, start_seq=first_seq)
                mine = [m for m in stored if m.headers.get(HEADER_WATERMARK) == str(due_ms)]
                if len(mine) >= jobs or now_ms() > deadline:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(1.0)  # followers' late turns on this herd are counted too
            cpu_s = fleet_cpu(fleet.members) - cpu_before
            after = await _counters(fleet.members)
            claims_after = await last_seq(js, claims_stream)
            delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
            count = max(1, len(mine))
            herd = Herd(
                due_ms=due_ms,
                triggers=len(mine),
                last_s=(max(m.stored_ms for m in mine) - due_ms) / 1000 if mine else math.nan,
                repeats=delta.get("outcome:duplicate", 0.0),
                claim_ops=sum(delta.get(k, 0.0) for k in CLAIM_OPS) / count,
                claim_messages=(claims_after - claims_before) / count,
                cpu_us=cpu_s / count * 1e6,
            )
            result.herds.append(herd)
            log(  # type: ignore[operator]
                f"  herd of {jobs} at {due_ms}: {herd.triggers} triggers, last "
                f"{herd.last_s:.2f} s after due (floor {result.floor_s:.2f} s), "
                f"{herd.repeats:.0f} repeats, {herd.claim_ops:.2f} claim ops and "
                f"{herd.claim_messages:.2f} claim messages per trigger, {herd.cpu_us:.0f} µs"
            )
        await delete_jobs(stores, [s.name for s in specs], limit=512)
    finally:
        fleet.stop()
        await stores.client.close()
    return result


def goal_rows(r: HerdsResult | None) -> list[tuple[str, str, str]]:
    if r is None or not r.herds:
        return []
    last, messages = r.worst_last_s, r.worst_claim_messages
    return [
        (
            f"repeated herds ({r.jobs:,} jobs every {PERIOD_S} s): last trigger "
            f"≤ {LAST_GOAL_S:g} s after due",
            f"{fmt(last, 2)} s (floor {fmt(r.floor_s, 2)} s)",
            "yes" if last <= LAST_GOAL_S else "**no**",
        ),
        (
            f"repeated herds: ≤ {CLAIM_MSGS_GOAL:g} claims-bucket messages per trigger",
            fmt(messages, 2),
            "yes" if messages <= CLAIM_MSGS_GOAL else "**no**",
        ),
        (
            "repeated herds: no publish refused as a repeat",
            f"{r.repeats:.0f}",
            "yes" if r.repeats == 0 else "**no**",
        ),
    ]


def section(r: HerdsResult | None, number: int) -> list[str]:
    if r is None or not r.herds:
        return []
    out = [
        f"## {number}. Repeated herds",
        "",
        f"{r.jobs:,} jobs `*/{PERIOD_S} * * * * *` on 3 replicas (one nats-server), measured "
        f"after {r.settle_s:g} s of herds. The floor is one process publishing as many "
        f"messages with `Nats-Msg-Id`, pipelined, in the same run: {fmt(r.floor_s, 2)} s.",
        "",
        "| herd | triggers | last stored after due | × floor | repeats refused | "
        "claim ops / trigger | claim messages / trigger | CPU / trigger |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, h in enumerate(r.herds, 1):
        times = ratio(h.last_s, r.floor_s)
        out.append(
            f"| {i} | {h.triggers:,} | {fmt(h.last_s, 2)} s | {fmt(times, 1)}× "
            f"| {h.repeats:.0f} | {fmt(h.claim_ops, 2)} | {fmt(h.claim_messages, 2)} | "
            f"{fmt(h.cpu_us, 0)} µs |"
        )
    return [*out, ""]
