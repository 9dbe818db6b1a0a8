"""The console at N jobs: how long its first pages take, how fast a search answers as a person
types, and what an open page costs the replica.

One replica with N ``@hourly`` jobs (``jitter = 3600s``), a quarter of them tagged and one in a
hundred paused. Each request is an HTTP GET from this process, timed to the last byte: the
fleet page (the first view starts the walk over every job that counts the next hour, in the
background; how long until a view shows it is measured too), the job list's first page, a
job's page, and the job list's results part for each keystroke of a search (prefix, then
substring, then nothing matching) and for the filters; then, after a job is paused (its name
stays) and after one is added (the names change), the next keystroke and the next filtered query
(which rebuild the index and the facets), each while another thread asks ``/healthz`` over and
over: its slowest answer is the longest the replica's event loop was held meanwhile (plus a
round trip). The cost of an open page: the
replica's CPU over a window with nobody looking, then with one page of each kind open the way
the console's script keeps it (an event stream, and the parts it fetches when a pulse says
they changed).
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hrwcron.core.model import JobSpec

from .common import Deployment, cpu_seconds, fmt, put_jobs, stores_for, until

REPEATS = 5
WINDOW_S = 30.0
KEYSTROKES = ("q", "q-", "q-4", "q-42", "q-421", "q-4217", "4217", "217", "zzz")
FILTERS = ("state=paused", "tag=batch", "state=paused&q=q-1", "missed=1")
TARGETS = {"first_page_ms": 1000.0, "search_ms": 100.0, "cpu_percent": 1.0, "held_ms": 20.0}


@dataclass
class ConsoleResult:
    jobs: int
    ready_s: float = math.nan
    pages_ms: dict[str, float] = field(default_factory=dict)  # slowest of REPEATS
    first_fleet_ms: float = math.nan  # the first fleet page, which starts the walk
    timeline_s: float = math.nan  # from that view until a view shows the counted hour
    search_ms: dict[str, float] = field(default_factory=dict)  # slowest of REPEATS
    filter_ms: dict[str, float] = field(default_factory=dict)
    first_filter_ms: float = math.nan  # the first filtered query, which builds the facets
    # label -> ms: the keystroke and the filtered query after a job changed
    after_change_ms: dict[str, float] = field(default_factory=dict)
    # label -> the slowest /healthz answered while that query (or the first filtered) ran
    held_ms: dict[str, float] = field(default_factory=dict)
    alone_held_ms: float = math.nan  # the same over 2 s with nothing asked of the console
    # label -> (kind, longest turn ms, whole build ms): the console's index builds each
    # request set off, as the replica's metrics time them
    builds: dict[str, tuple[str, float, float]] = field(default_factory=dict)
    idle_cpu: float = math.nan  # percent of a core, nobody looking
    open_cpu: float = math.nan  # percent of a core, one page of each kind open

    @property
    def slowest_search_ms(self) -> float:
        return max(self.search_ms.values(), default=math.nan)

    @property
    def longest_turn_ms(self) -> float:
        return max((turn for _, turn, _ in self.builds.values()), default=math.nan)

    @property
    def first_page_ms(self) -> float:
        return max(self.pages_ms.values(), default=math.nan)


def specs(count: int) -> list[JobSpec]:
    return [
        JobSpec(
            name=f"q-{i}",
            schedule="@hourly",
            jitter=3600.0,
            tags=["batch"] if i % 4 == 0 else [],
            paused=i % 100 == 7,
        )
        for i in range(count)
    ]


def _get(url: str) -> tuple[float, bytes]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return (time.perf_counter() - began) * 1000, body


async def _slowest(url: str) -> float:
    return max([(await asyncio.to_thread(_get, url))[0] for _ in range(REPEATS)])


def _counted(base: str) -> bool:
    return b'id="timeline"' in _get(base + "/?part=fleet")[1]


def _loaded(base: str, count: int) -> bool:
    try:
        _, body = _get(f"{base}/status?limit=1")
    except OSError:
        return False
    return int(json.loads(body)["summary"]["jobs"]) == count


async def _held(base: str, work: Callable[[], Awaitable[float]]) -> tuple[float, float]:
    """What ``work`` returns, and the slowest ``/healthz`` a thread asked over and over while it
    ran (new connections: each answer waits for whatever holds the event loop)."""
    stop = threading.Event()
    slowest = [0.0]

    def ask() -> None:
        while not stop.is_set():
            slowest[0] = max(slowest[0], _get(base + "/healthz")[0])

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    try:
        result = await work()
    finally:
        stop.set()
        await asyncio.to_thread(asking.join)
    return result, slowest[0]


async def _after_change(
    base: str, result: ConsoleResult, what: str, change: Callable[[], Awaitable[None]]
) -> None:
    """After ``change`` shows in /status: the next keystroke and the next filtered query."""
    await change()

    async def keystroke() -> float:
        return (await asyncio.to_thread(_get, f"{base}/jobs?q=q-4&part=results"))[0]

    async def filtered() -> float:
        return (await asyncio.to_thread(_get, f"{base}/jobs?state=active&part=results"))[0]

    for label, work in (
        (f"{what}: the next keystroke", keystroke),
        (f"{what}: the next filter", filtered),
    ):
        timed = await _timed_builds(base, result, label, work)
        result.after_change_ms[label], result.held_ms[label] = timed


def _index_timings(base: str) -> dict[str, tuple[float, float]]:
    """The replica's timing of its console's latest build of each kind: (longest turn, whole
    build) in ms."""
    _, body = _get(base + "/metrics")
    found: dict[str, list[float]] = {}
    names = ("hrwcron_console_index_longest_turn_seconds", "hrwcron_console_index_build_seconds")
    for line in body.decode().splitlines():
        for slot, metric in enumerate(names):
            if line.startswith(metric + '{build="'):
                build = line.split('"')[1]
                found.setdefault(build, [math.nan, math.nan])[slot] = float(line.split()[-1]) * 1000
    return {build: (turn, whole) for build, (turn, whole) in found.items()}


async def _timed_builds(
    base: str, result: ConsoleResult, label: str, work: Callable[[], Awaitable[float]]
) -> tuple[float, float]:
    """``_held(work)``, and the builds it set off (the kinds whose timing moved) recorded."""
    before = await asyncio.to_thread(_index_timings, base)
    answer = await _held(base, work)
    after = await asyncio.to_thread(_index_timings, base)
    for build, (turn, whole) in after.items():
        if before.get(build) != (turn, whole):
            result.builds[f"{label} ({build})"] = (build, turn, whole)
    return answer


def _shows(base: str, prefix: str, check: Callable[[dict[str, Any]], bool]) -> bool:
    _, body = _get(f"{base}/status?limit=1&prefix={prefix}")
    return check(json.loads(body))


async def _open_pages(base: str, seconds: float) -> None:
    """One fleet page, one job list and one job's page, kept current as console.js does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def watch(query: str, part: str, changed: list[str]) -> None:
        reader, writer = await asyncio.open_connection(*base[len("http://") :].split(":"))
        writer.write(f"GET /events{query} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        await writer.drain()
        before: dict[str, object] | None = None
        try:
            while loop.time() < deadline:
                try:
                    line = await asyncio.wait_for(reader.readline(), deadline - loop.time())
                except TimeoutError:
                    break
                if not line.startswith(b"data: "):
                    continue
                pulse = json.loads(line[6:])
                slow = before is not None and pulse["slot"] != before["slot"]
                slow = slow and pulse["slot"] % 3 == 0
                if before is not None and (
                    any(pulse.get(k) != before.get(k) for k in changed) or slow
                ):
                    await asyncio.to_thread(_get, base + part)
                before = pulse
        finally:
            writer.close()

    await asyncio.gather(
        watch("", "/?part=fleet", ["fleet"]),
        watch("", "/jobs?part=results", ["jobs"]),
        watch("?job=q-42", "/jobs/q-42?part=live", ["job", "jobs"]),
    )


async def run(dep: Deployment, jobs: int, log: object) -> ConsoleResult:
    result = ConsoleResult(jobs=jobs)
    stores = await stores_for(dep.config())
    fleet = dep.fleet("console")
    try:
        await put_jobs(stores, specs(jobs), limit=512)
        log(f"  wrote {jobs:,} jobs")  # type: ignore[operator]
        (replica,) = fleet.start(1)
        base = f"http://{replica.env['HRWCRON_HTTP_LISTEN']}"
        await fleet.wait_ready(timeout=300)
        loaded = f"{jobs} jobs loaded"
        await until(lambda: asyncio.to_thread(_loaded, base, jobs), 300, loaded, interval=1.0)
        result.ready_s = time.time() - replica.spawned_at
        began = time.perf_counter()
        result.first_fleet_ms = (await asyncio.to_thread(_get, base + "/"))[0]
        await until(
            lambda: asyncio.to_thread(_counted, base), 300, "the next hour counted", interval=0.2
        )
        result.timeline_s = time.perf_counter() - began
        before = await asyncio.to_thread(_index_timings, base)
        for label, path in (("fleet", "/"), ("jobs", "/jobs"), ("job", "/jobs/q-42")):
            result.pages_ms[label] = await _slowest(base + path)
        for build, (turn, whole) in (await asyncio.to_thread(_index_timings, base)).items():
            if before.get(build) != (turn, whole):
                result.builds[f"the first job list ({build})"] = (build, turn, whole)
        for typed in KEYSTROKES:
            result.search_ms[typed] = await _slowest(f"{base}/jobs?q={typed}&part=results")

        async def first_filter() -> float:
            return (await asyncio.to_thread(_get, f"{base}/jobs?state=active"))[0]

        label = "the first filtered query"
        timed = await _timed_builds(base, result, label, first_filter)
        result.first_filter_ms, result.held_ms[label] = timed
        for query in FILTERS:
            result.filter_ms[query] = await _slowest(f"{base}/jobs?{query}&part=results")

        log(  # type: ignore[operator]
            f"  pages {result.pages_ms}, slowest keystroke {result.slowest_search_ms:.0f} ms"
        )
        began = cpu_seconds(replica.pid)
        await asyncio.sleep(WINDOW_S)
        result.idle_cpu = (cpu_seconds(replica.pid) - began) / WINDOW_S * 100
        began = cpu_seconds(replica.pid)
        await _open_pages(base, WINDOW_S)
        result.open_cpu = (cpu_seconds(replica.pid) - began) / WINDOW_S * 100
        cpu = f"  CPU idle {result.idle_cpu:.2f}%, pages open {result.open_cpu:.2f}%"
        log(cpu)  # type: ignore[operator]

        # Last, so that the walks they start do not fall into the CPU windows above.
        async def nothing() -> float:
            await asyncio.sleep(2.0)
            return math.nan

        _, result.alone_held_ms = await _held(base, nothing)
        last = specs(jobs)[-1]  # no other name starts with the last one's

        async def pause_one() -> None:
            await put_jobs(stores, [msgspec.structs.replace(last, paused=True)])

            def paused(doc: dict[str, Any]) -> bool:
                return bool(doc["jobs"] and doc["jobs"][0]["paused"])

            await until(lambda: asyncio.to_thread(_shows, base, last.name, paused), 60, "paused")

        async def add_one() -> None:
            await put_jobs(stores, [JobSpec(name="q-new", schedule="@hourly")])

            def grown(doc: dict[str, Any]) -> bool:
                return bool(doc["summary"]["jobs"] == jobs + 1)

            await until(lambda: asyncio.to_thread(_shows, base, "q-new", grown), 60, "q-new")

        await _after_change(base, result, "a job paused", pause_one)
        await _after_change(base, result, "a job added", add_one)
    finally:
        fleet.stop()
        await stores.client.close()
    return result


def goal_rows(r: ConsoleResult | None) -> list[tuple[str, str, str]]:
    if r is None or not r.pages_ms:
        return []
    n = f"{r.jobs:,} jobs"
    extra = r.open_cpu - r.idle_cpu
    return [
        (
            f"console ({n}): first page < 1 s",
            f"{fmt(r.first_page_ms, 0)} ms (the very first fleet view "
            f"{fmt(r.first_fleet_ms, 0)} ms; its hour counted {fmt(r.timeline_s, 1)} s later)",
            _ok(r.first_page_ms < TARGETS["first_page_ms"]),
        ),
        (
            f"console ({n}): search < 100 ms per keystroke",
            f"{fmt(r.slowest_search_ms, 0)} ms (slowest)",
            _ok(r.slowest_search_ms < TARGETS["search_ms"]),
        ),
        (
            f"console ({n}): rebuilding the index and filters holds the event loop < 20 ms",
            f"{fmt(r.longest_turn_ms, 1)} ms (the longest turn of a build)",
            _ok(r.longest_turn_ms < TARGETS["held_ms"]),
        ),
        (
            f"console ({n}): open pages cost < 1% of a core",
            f"{fmt(extra, 2)}% ({fmt(r.open_cpu, 2)}% with, {fmt(r.idle_cpu, 2)}% without)",
            _ok(extra < TARGETS["cpu_percent"]),
        ),
    ]


def section(r: ConsoleResult | None, number: int) -> list[str]:
    if r is None or not r.pages_ms:
        return []
    median = statistics.median(r.search_ms.values())
    out = [
        f"## {number}. The console at {r.jobs:,} jobs",
        "",
        f"One replica with {r.jobs:,} `@hourly` jobs (`jitter = 3600s`, a quarter tagged "
        f"`batch`, one in a hundred paused), ready after {fmt(r.ready_s, 1)} s. Each figure is "
        f"the slowest of {REPEATS} HTTP GETs from the benchmark process, to the last byte.",
        "",
        "| request | ms |",
        "|---|---:|",
        f"| fleet page, the very first (starts the walk over every job) | "
        f"{fmt(r.first_fleet_ms, 0)} |",
        f"| ... until a view shows the next hour counted | {fmt(r.timeline_s * 1000, 0)} |",
    ]
    out += [f"| page `{label}` | {fmt(ms, 0)} |" for label, ms in r.pages_ms.items()]
    out += [f"| search `q={q}` (results part) | {fmt(ms, 1)} |" for q, ms in r.search_ms.items()]
    out.append(f"| first filtered query (builds the facets) | {fmt(r.first_filter_ms, 0)} |")
    out += [f"| filter `{q}` | {fmt(ms, 1)} |" for q, ms in r.filter_ms.items()]
    out += [f"| {label} | {fmt(ms, 0)} |" for label, ms in r.after_change_ms.items()]
    held = "; ".join(f"{label} {fmt(ms, 1)} ms" for label, ms in r.held_ms.items())
    out += [
        "",
        "The index and the facets are built in slices that let the event loop run between them; "
        "the replica times each build (`hrwcron_console_index_longest_turn_seconds`, "
        "`hrwcron_console_index_build_seconds`):",
        "",
        "| build, set off by | longest turn ms | whole build ms |",
        "|---|---:|---:|",
    ]
    out += [
        f"| {label} | {fmt(turn, 1)} | {fmt(whole, 0)} |"
        for label, (_, turn, whole) in r.builds.items()
    ]
    out += [
        "",
        "The slowest `/healthz` (asked over and over from another thread, a new connection "
        f"each) answered while each ran: {held}; over 2 s with nothing asked of the console, "
        f"{fmt(r.alone_held_ms, 1)} ms. A request waits up to a build's turn at each step the "
        "event loop takes it through (accepting, reading, answering), so it takes several "
        "turns longer than the longest one.",
        "",
        f"Median keystroke {fmt(median, 1)} ms. The replica's CPU over {WINDOW_S:.0f} s: "
        f"{fmt(r.idle_cpu, 2)}% of a core with nobody looking, {fmt(r.open_cpu, 2)}% with a "
        "fleet page, a job list and a job's page open (each an event stream, fetching its "
        "part when a pulse says it changed, as the console's script does).",
        "",
    ]
    return out


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"
