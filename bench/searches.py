"""Bounded searches: what checking a job's exclusions costs at worst, and what a replica's event
loop sees while it loads and serves specs built to exhaust the search.

Part one, in this process: each spec's write-time check ("does it ever fire", from 1970 and from
now), the median of several runs, beside a plain schedule's check measured the same way (the
floor). The adversarial specs are the ones a hostile operator would write: exclusions that
leave one second in two minutes, or every other second.

Part two, on a real replica: N ordinary jobs and four adversarial specs written straight into
the jobs bucket (around the admin API, which refuses them). The replica's event-loop lag probe
(``bench/replica.py``) reports the longest stall while it loads them, and while the status
page, ``/status?timeline=1`` and a full ``/status`` are requested again and again.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import urllib.request
from dataclasses import dataclass, field

from hrwcron.core.model import JobSpec, encode
from hrwcron.core.plan import SEARCH_BUDGET

from .common import Deployment, Replica, fmt, put_jobs, ratio, stores_for

RUNS = 5
REQUESTS = 5
LAG_GOAL_MS = 50.0
# Specs a hostile operator would write, beside ones that are dense but fine.
ADVERSARIAL = {
    "one second in two minutes": ("* * * * * *", ["0-58 * * * * *", "59 * * * * *"]),
    "every other second": ("* * * * * *", ["*/2 * * * * *", "1-59/2 * * * * *"]),
    "one second an hour (dense, fires)": (
        "* * * * * *",
        ["0-58 * * * * *", "59 0-58 * * * *"],
    ),
}
ORDINARY = {
    "plain (floor)": ("* * * * *", []),
    "office hours excluded": ("* * * * *", ["* 9-17 * * 1-5"]),
    "weekends excluded": ("0 9 * * *", ["* * * * 6,0"]),
}


@dataclass
class SpecCost:
    name: str
    adversarial: bool
    steps: int
    check_ms: float
    verdict: str


@dataclass
class SearchesResult:
    jobs: int
    costs: list[SpecCost] = field(default_factory=list)
    ready_s: float = math.nan
    load_lag_ms: float = math.nan
    load_wall_ms: float = math.nan
    request_ms: dict[str, float] = field(default_factory=dict)
    request_lag_ms: float = math.nan
    request_wall_ms: float = math.nan
    skipped: int = 0

    @property
    def floor_ms(self) -> float:
        return next((c.check_ms for c in self.costs if c.name == "plain (floor)"), math.nan)

    @property
    def worst(self) -> SpecCost | None:
        bad = [c for c in self.costs if c.adversarial]
        return max(bad, key=lambda c: c.check_ms) if bad else None


def spec_costs(now_ms: int) -> list[SpecCost]:
    out: list[SpecCost] = []
    for table, adversarial in ((ORDINARY, False), (ADVERSARIAL, True)):
        for name, (schedule, exclude) in table.items():
            spec = JobSpec(name="bench.search", schedule=schedule, exclude=exclude)
            times = []
            problems = []
            for _ in range(RUNS):
                began = time.perf_counter()
                problems = spec.problems(now_ms=now_ms)
                times.append((time.perf_counter() - began) * 1000)
            plan = spec.plan()
            steps = plan.search(0).steps + plan.search(now_ms).steps
            verdict = "refused" if problems else "accepted"
            out.append(SpecCost(name, adversarial, steps, statistics.median(times), verdict))
    return out


def _get(url: str) -> float:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
    return (time.perf_counter() - began) * 1000


def _lag(replica: Replica, since: float, until_t: float, key: str = "busy_ms") -> float:
    """The longest stall the probe saw in the window; ``busy_ms`` is the part the process
    spent computing (on 2 shared cores the rest is time the OS gave to someone else)."""
    lags = [e.data[key] for e in replica.poll() if e.kind == "lag" and since <= e.t <= until_t]
    return max(lags) if lags else math.nan


async def run(dep: Deployment, jobs: int, log: object) -> SearchesResult:
    result = SearchesResult(jobs=jobs)
    result.costs = await asyncio.to_thread(spec_costs, int(time.time() * 1000))
    config = dep.config()
    stores = await stores_for(config)
    fleet = dep.fleet("searches", BENCH_PROBE="1")
    try:
        specs = [JobSpec(name=f"q-{i}", schedule="@hourly", jitter=3600.0) for i in range(jobs)]
        await put_jobs(stores, specs, limit=512)
        js = stores.client.jetstream()
        kv = await js.key_value(config.scheduler.jobs_bucket)
        evil = ADVERSARIAL["one second in two minutes"]
        for i in range(4):  # around the API, as an old or hostile writer would
            name = f"evil.{i}"
            await kv.put(name, encode(JobSpec(name=name, schedule=evil[0], exclude=evil[1])))
        log(f"  wrote {jobs} jobs and 4 adversarial specs")  # type: ignore[operator]
        (replica,) = fleet.start(1)
        await fleet.wait_ready(timeout=300)
        ready = replica.last("readiness")
        assert ready is not None
        result.ready_s = ready.t - replica.spawned_at
        await asyncio.sleep(2.0)  # the probe reports once a second
        result.load_lag_ms = _lag(replica, replica.spawned_at, time.time())
        result.load_wall_ms = _lag(replica, replica.spawned_at, time.time(), "max_ms")
        base = f"http://{replica.env['HRWCRON_HTTP_LISTEN']}"
        began = time.time()
        for label, path in (
            ("page", "/"),
            ("timeline", "/status?timeline=1"),
            ("status", f"/status?limit={min(jobs, 10_000)}"),
        ):
            times = [await asyncio.to_thread(_get, base + path) for _ in range(REQUESTS)]
            result.request_ms[label] = max(times)
        await asyncio.sleep(2.0)
        result.request_lag_ms = _lag(replica, began, time.time())
        result.request_wall_ms = _lag(replica, began, time.time(), "max_ms")
        status = await asyncio.to_thread(
            lambda: urllib.request.urlopen(base + "/status", timeout=30).read()
        )
        result.skipped = status.count(b"cannot be decided")
    finally:
        fleet.stop()
        await stores.client.close()
    return result


def goal_rows(r: SearchesResult | None) -> list[tuple[str, str, str]]:
    if r is None or not r.costs:
        return []
    worst = r.worst
    rows = []
    if worst is not None:
        rows.append(
            (
                "searches: worst adversarial write-time check in milliseconds, not seconds",
                f"{fmt(worst.check_ms, 1)} ms ({worst.name}, {worst.verdict})",
                "yes" if worst.check_ms < 100 else "**no**",
            )
        )
    lag = max(r.load_lag_ms, r.request_lag_ms)
    rows.append(
        (
            f"searches ({r.jobs:,} jobs + 4 adversarial): loop stall < {LAG_GOAL_MS:g} ms "
            "(computing) loading / serving the page",
            f"{fmt(r.load_lag_ms, 0)} / {fmt(r.request_lag_ms, 0)} ms "
            f"({fmt(r.load_wall_ms, 0)} / {fmt(r.request_wall_ms, 0)} wall)",
            "yes" if lag < LAG_GOAL_MS else "**no**",
        )
    )
    slowest = max(r.request_ms.values(), default=math.nan)
    rows.append(
        (
            f"searches ({r.jobs:,} jobs + 4 adversarial): status page < 1 s",
            f"{fmt(slowest / 1000, 2)} s",
            "yes" if slowest < 1000 else "**no**",
        )
    )
    return rows


def section(r: SearchesResult | None, number: int) -> list[str]:
    if r is None or not r.costs:
        return []
    out = [
        f"## {number}. Bounded searches",
        "",
        f"Each spec's write-time check (`JobSpec.problems` with the time now: \"does it ever "
        f'fire", from 1970 and from now), the median of {RUNS} runs in the benchmark process; '
        f"steps are the excluded stretches the two searches examined (the bound is "
        f"{SEARCH_BUDGET:,} each). × floor is against the plain schedule's check.",
        "",
        "| spec | steps | check ms | × floor | verdict |",
        "|---|---:|---:|---:|---|",
    ]
    for c in r.costs:
        times = ratio(c.check_ms, r.floor_ms)
        out.append(
            f"| {c.name}{' (adversarial)' if c.adversarial else ''} | {c.steps:,} | "
            f"{fmt(c.check_ms, 2)} | {fmt(times, 0)}× | {c.verdict} |"
        )
    requests = ", ".join(f"{k} {fmt(v, 0)} ms" for k, v in r.request_ms.items())
    out += [
        "",
        f"One replica with {r.jobs:,} `@hourly` jobs (`jitter = 3600s`) and 4 specs that leave one "
        "second in two minutes, written straight into the jobs bucket: ready after "
        f"{fmt(r.ready_s, 1)} s with {r.skipped} specs skipped as undecidable; longest event-loop "
        f"stall while loading {fmt(r.load_wall_ms, 0)} ms ({fmt(r.load_lag_ms, 0)} computing). "
        f"Slowest of {REQUESTS} requests each: {requests}; longest stall meanwhile "
        f"{fmt(r.request_wall_ms, 0)} ms ({fmt(r.request_lag_ms, 0)} computing).",
        "",
    ]
    return out
