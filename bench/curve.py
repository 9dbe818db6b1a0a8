"""Spread rate curve: how many spread ticks a second the fleet fires on time, beside NATS's own
scheduler on the same server.

Each rate is that many every-second jobs with ``jitter = 1s`` on 3 replicas (one nats-server),
so the ticks are spread evenly over each second; the native scheduler fires one-shot ``@at``
schedules at the same instants. Lateness and CPU are measured as in the precision section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .common import Deployment, fmt
from .precision import Run, hrwcron_fleet_runs, native_variant_runs

# The spread rate a sustained fleet is held to, and the lateness it must keep under.
TARGET_RATE = 5_000
TARGET_P99_MS = 10.0
# Capacity as replicas are added: fleets holding shares (two holders a lane) at one rate.
CAPACITY_FLEETS = (3, 6)
CAPACITY_HOLDERS = 2


@dataclass
class CurveResult:
    rates: list[int]
    seconds: int
    hrwcron: list[Run] = field(default_factory=list)
    native: list[Run] = field(default_factory=list)
    native_problem: str = ""
    capacity_rate: int = 0
    capacity: list[Run] = field(default_factory=list)  # one run per fleet size

    def sustained(self) -> int:
        """The highest rate measured with p99 under the target and no trigger missing."""
        held = [
            run.jobs for run in self.hrwcron if run.missing == 0 and run.summary.p99 < TARGET_P99_MS
        ]
        return max(held, default=0)


async def run(
    dep: Deployment, rates: list[int], seconds: int, warmup: int, log: object
) -> CurveResult:
    result = CurveResult(rates, seconds)
    variants = [(f"rate{rate}", rate, True) for rate in rates]
    result.hrwcron = await hrwcron_fleet_runs(dep, variants, seconds, warmup, log)
    result.capacity_rate = rate = rates[len(rates) // 2]
    for replicas in CAPACITY_FLEETS:
        result.capacity += await hrwcron_fleet_runs(
            dep,
            [(f"cap{replicas}", rate, True)],
            seconds,
            warmup,
            log,
            replicas=replicas,
            holders=CAPACITY_HOLDERS,
        )
    try:
        result.native = await native_variant_runs(
            dep, [(rate, True) for rate in rates], seconds, warmup, log
        )
    except Exception as exc:
        result.native_problem = f"could not be driven: {type(exc).__name__}: {exc}"
    return result


def _find(runs: list[Run], rate: int) -> Run | None:
    return next((r for r in runs if r.jobs == rate), None)


def goal_rows(r: CurveResult | None) -> list[tuple[str, str, str]]:
    if r is None or not r.hrwcron:
        return []
    best = r.sustained()
    ok = "yes" if best >= TARGET_RATE else "**no**"
    return [
        (
            f"curve: ≥ {TARGET_RATE:,} spread ticks/s with p99 < {TARGET_P99_MS:g} ms, none lost",
            f"{best:,}/s",
            ok,
        )
    ]


def section(r: CurveResult | None, number: int) -> list[str]:
    if r is None or not r.hrwcron:
        return []
    out = [
        f"## {number}. Spread rate curve",
        "",
        f"N every-second jobs with `jitter = 1s` (N spread ticks a second) for {r.seconds} s on "
        "3 replicas and one nats-server; beside it NATS's own scheduler firing one-shot `@at` "
        "schedules at the same instants on the same server. CPU is the replicas' CPU per "
        "trigger, summed over the 3.",
        "",
        "| ticks/s | hrwcron triggers (expected) | p50 ms | p99 ms | CPU / trigger | "
        "native triggers (expected) | native p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rate in r.rates:
        mine = _find(r.hrwcron, rate)
        if mine is None:
            continue
        s = mine.summary
        native = _find(r.native, rate)
        if native is not None and native.lateness_ms:
            n = native.summary
            theirs = f"{n.count:,} ({native.expected:,}) | {fmt(n.p99, 1)}"
        else:
            theirs = "- | -"
        cost = "-" if math.isnan(mine.tick_cost_us) else f"{mine.tick_cost_us:.0f} µs"
        out.append(
            f"| {rate:,} | {s.count:,} ({mine.expected:,}) | {fmt(s.p50, 1)} | "
            f"{fmt(s.p99, 1)} | {cost} | {theirs} |"
        )
    notes = [f"{run.label} {run.jobs:,}: {run.note}" for run in r.native if run.note]
    if r.native_problem:
        notes.append(f"native scheduler: {r.native_problem}")
    if notes:
        out += ["", *[f"- {n}" for n in notes]]
    out += [
        "",
        f"Highest rate held with p99 < {TARGET_P99_MS:g} ms and nothing lost: "
        f"{r.sustained():,} ticks/s.",
        "",
    ]
    return [*out, *capacity_section(r), ""]


def capacity_section(r: CurveResult) -> list[str]:
    """What each replica spends as replicas are added. Every replica runs on the same two
    cores here, so the fleet's rate cannot grow with it; what shows capacity is the busiest
    replica's CPU per trigger, which bounds the rate one core per replica sustains."""
    if not r.capacity:
        return []
    out = [
        f"**Capacity as replicas are added** ({r.capacity_rate:,} spread ticks/s, "
        f"`scheduler.holders = {CAPACITY_HOLDERS}`, the same {r.seconds} s): every replica shares "
        "this machine's two cores, so the rate cannot grow here; the busiest replica's CPU per "
        "trigger says what one core per replica would sustain.",
        "",
        "| replicas | triggers (expected) | p99 ms | fleet CPU / trigger | busiest replica "
        "CPU / trigger | one core per replica sustains |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for run in r.capacity:
        s = run.summary
        busiest = run.busiest_cost_us
        ceiling = f"{1e6 / busiest:,.0f} ticks/s" if busiest > 0 else "-"
        out.append(
            f"| {run.replicas} | {s.count:,} ({run.expected:,}) | {fmt(s.p99, 1)} | "
            f"{run.tick_cost_us:.0f} µs | {busiest:.0f} µs | {ceiling} |"
        )
    return [*out, ""]
