"""Holding shares (``scheduler.holders = 2``) at J jobs: what each replica holds, its memory and
its start-up, 3 replicas against 6, beside 3 replicas that each hold every job.

On one nats-server: 6 replicas holding shares start on an empty jobs bucket, ``hrwcron apply``
writes J new jobs (a CLI process timed from spawn to exit), and the time until every replica
holds its share is taken; then one replica is killed (``kill -9``) and the time until the five
left hold every lane twice again. Each fleet is then started cold on the J jobs: time until
every replica is ready, resident memory and jobs held per replica.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from .common import Deployment, Fleet, fmt, rss_mb, stores_for, until
from .operator import Command, _cli, specs

HOLDERS = 2
# The goals of holding shares, stated for 1,000,000 jobs on 6 replicas.
GOAL_RSS_MB = 400.0
GOAL_READY_S = 60.0
GOAL_APPLY_S = 120.0
GOAL_MOVE_S = 10.0
# Seconds of patience per job on top of each wait: a million jobs take minutes to load on two cores.
PATIENCE_S_PER_JOB = 1 / 2_500


@dataclass
class FleetFigures:
    label: str
    replicas: int
    holders: int
    ready_s: float = math.nan  # from spawn until the last replica is ready
    rss_mb: list[float] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    problem: str = ""  # why the fleet's figures are missing, when it did not settle

    @property
    def share(self) -> float:
        return max(self.held, default=0) / max(1, self.jobs_total)

    jobs_total: int = 0


@dataclass
class SharesResult:
    jobs: int
    apply_s: float = math.nan
    apply_line: str = ""
    loaded_s: float = math.nan  # after apply returned, until every replica holds its share
    move_s: float = math.nan  # after kill -9, until the five left hold every lane twice
    member_ttl_s: float = 3.0
    fleets: list[FleetFigures] = field(default_factory=list)
    nats_rss_mb: float = math.nan


async def _held(stores: object, nodes: list[str]) -> dict[str, int]:
    """Jobs held per node, as each announces in its heartbeat (nothing while NATS, busy
    with a million jobs, does not answer: the caller asks again)."""
    try:
        records = await stores.members.snapshot()  # type: ignore[attr-defined]
    except Exception:
        return {}
    return {n: r.heartbeat.jobs for n, r in records.items() if n in nodes}


async def _cold_start(
    dep: Deployment, stores: object, label: str, replicas: int, holders: int, jobs: int
) -> FleetFigures:
    figures = FleetFigures(label, replicas, holders, jobs_total=jobs)
    fleet: Fleet = dep.fleet(f"shares-{label}", HRWCRON_SCHEDULER_HOLDERS=str(holders))
    slack = jobs * PATIENCE_S_PER_JOB
    try:
        began = time.time()
        fleet.start(replicas)
        await fleet.wait_ready(timeout=300 + slack)
        figures.ready_s = max(r.last("readiness").t for r in fleet.members) - began  # type: ignore[union-attr]
        nodes = [r.node for r in fleet.members]
        expected = jobs * (min(holders, replicas) if holders else replicas)

        async def settled() -> bool:
            return sum((await _held(stores, nodes)).values()) == expected

        await until(settled, 120 + slack, f"{label}: every job held {expected // jobs} times")
        held = await _held(stores, nodes)
        figures.held = [held[n] for n in nodes]
        figures.rss_mb = [rss_mb(r.pid) for r in fleet.members]
    except (TimeoutError, RuntimeError) as exc:
        # One fleet that does not settle at this size still leaves the others' figures.
        figures.problem = str(exc).splitlines()[0]
    finally:
        fleet.stop()
    return figures


async def run(dep: Deployment, jobs: int, log: Callable[[str], None]) -> SharesResult:
    result = SharesResult(jobs=jobs)
    stores = await stores_for(dep.config())
    work = Path(tempfile.mkdtemp(prefix="hrwcron-bench-shares-"))
    fleet = dep.fleet("shares-apply", HRWCRON_SCHEDULER_HOLDERS=str(HOLDERS))
    try:
        fleet.start(6)
        await fleet.wait_ready(timeout=120)
        nodes = [r.node for r in fleet.members]
        jobs_file = work / "jobs.json"
        jobs_file.write_bytes(msgspec.json.encode(specs(jobs)))
        command = await asyncio.to_thread(
            _cli, dep.url, Command("apply", ["apply", str(jobs_file)]), work
        )
        if command.exit_code != 0:
            raise RuntimeError(f"apply exited {command.exit_code}: {command.last_line}")
        result.apply_s, result.apply_line = command.seconds, command.last_line
        log(f"  apply of {jobs:,} new jobs: {command.seconds:.1f} s ({command.last_line!r})")
        began = time.perf_counter()

        async def shares_held(members: list[str]) -> bool:
            return sum((await _held(stores, members)).values()) == jobs * HOLDERS

        slack = jobs * PATIENCE_S_PER_JOB
        await until(lambda: shares_held(nodes), 600 + slack, "every replica to hold its share")
        result.loaded_s = time.perf_counter() - began
        log(f"  every replica holds its share {result.loaded_s:.1f} s after apply returned")
        victim = fleet.members[0]
        victim.kill()
        killed = time.perf_counter()
        left = nodes[1:]
        await until(
            lambda: shares_held(left), 120 + slack, "the five left to hold every lane twice"
        )
        result.move_s = time.perf_counter() - killed
        log(f"  after kill -9 of {victim.node}: every lane held twice {result.move_s:.1f} s later")
        result.nats_rss_mb = rss_mb(dep.server.pid)
    finally:
        fleet.stop()
        await asyncio.to_thread(shutil.rmtree, work, True)
    for label, replicas, holders in (
        ("6 holding shares", 6, HOLDERS),
        ("3 holding shares", 3, HOLDERS),
        ("3 holding every job", 3, 0),
    ):
        figures = await _cold_start(dep, stores, label, replicas, holders, jobs)
        result.fleets.append(figures)
        if figures.problem:
            log(f"  {label}: {figures.problem}")
            continue
        log(
            f"  {label}: ready {figures.ready_s:.1f} s, RSS {max(figures.rss_mb):.0f} MB at "
            f"most, holding {max(figures.held):,} jobs at most"
        )
    await stores.client.close()
    return result


# ---------------------------------------------------------------------------------- report


def section(r: SharesResult | None, number: int) -> list[str]:
    if r is None:
        return []
    lines = [
        f"## {number}. Holding shares at {r.jobs:,} jobs",
        "",
        f"`scheduler.holders = {HOLDERS}`: each lane of jobs is held by two replicas, so each "
        "holds about 2/N of the jobs. One nats-server, file storage.",
        "",
        f"- `hrwcron apply` of {r.jobs:,} new jobs to 6 replicas: {r.apply_s:.1f} s "
        f"({r.jobs / r.apply_s:,.0f} jobs/s); every replica held its share "
        f"{r.loaded_s:.1f} s after it returned.",
        f"- After `kill -9` of one of the 6: every lane held twice again {r.move_s:.1f} s "
        f"later (the member TTL, {r.member_ttl_s:g} s, of it is noticing the replica is gone).",
        "",
        "| fleet | ready (s) | jobs held per replica | share | RSS per replica (MB) |",
        "|---|---:|---|---:|---|",
    ]
    for f in r.fleets:
        held = f"{min(f.held):,}–{max(f.held):,}" if f.held else "—"
        rss = (
            f"{min(f.rss_mb):.0f}–{max(f.rss_mb):.0f} (median {statistics.median(f.rss_mb):.0f})"
            if f.rss_mb
            else "—"
        )
        lines.append(
            f"| {f.replicas} replicas, {f.label.split(' ', 1)[1]} | {fmt(f.ready_s, 1)} | "
            f"{held} | {f.share:.2f} | {rss} |"
        )
    lines += [""]
    lines += [
        f"- {f.replicas} replicas, {f.label.split(' ', 1)[1]}: {f.problem}."
        for f in r.fleets
        if f.problem
    ]
    lines += ["", f"nats-server resident memory: {r.nats_rss_mb:.0f} MB.", ""]
    return lines


def goal_rows(r: SharesResult | None) -> list[tuple[str, str, str]]:
    if r is None:
        return []
    six = next((f for f in r.fleets if f.replicas == 6), None)
    rows = [
        (
            f"holding shares ({r.jobs:,} jobs): apply <= {GOAL_APPLY_S:g} s",
            f"{r.apply_s:.1f} s",
            _ok(r.apply_s <= GOAL_APPLY_S),
        ),
        (
            f"holding shares ({r.jobs:,} jobs): a leaving replica's share held again < "
            f"{GOAL_MOVE_S:g} s",
            f"{r.move_s:.1f} s after the kill",
            _ok(r.move_s < GOAL_MOVE_S),
        ),
    ]
    if six is not None and six.problem:
        rows.append(
            (
                f"holding shares ({r.jobs:,} jobs, 6 replicas): all ready < {GOAL_READY_S:g} s",
                six.problem,
                _ok(False),
            )
        )
    elif six is not None and six.rss_mb:
        rows += [
            (
                f"holding shares ({r.jobs:,} jobs, 6 replicas): RSS <= {GOAL_RSS_MB:g} MB",
                f"{max(six.rss_mb):.0f} MB",
                _ok(max(six.rss_mb) <= GOAL_RSS_MB),
            ),
            (
                f"holding shares ({r.jobs:,} jobs, 6 replicas): all ready < {GOAL_READY_S:g} s",
                f"{six.ready_s:.1f} s",
                _ok(six.ready_s < GOAL_READY_S),
            ),
            (
                f"holding shares ({r.jobs:,} jobs, 6 replicas): each holds <= about 2/6",
                f"{six.share:.3f}",
                _ok(six.share <= 2 / 6 * 1.06),
            ),
        ]
    return rows


def _ok(flag: bool) -> str:
    return "yes" if flag else "no"
