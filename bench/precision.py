"""Precision: N every-second jobs on 3 replicas, spread over the second by jitter and all aligned
on it, against NATS's own message scheduler firing the same instants on the same servers.

Lateness of a trigger = the stream leader's timestamp of the stored message minus the instant it
was meant to fire at: for hrwcron the nominal due (``Hrwcron-Watermark``) plus the job's jitter
offset, for the native scheduler the instant its schedule named.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from hrwcron.core.model import JobSpec
from hrwcron.core.schedule import jitter_ms
from hrwcron.engine.ports import HEADER_JOB, HEADER_WATERMARK

from .common import (
    Deployment,
    Stored,
    Summary,
    connect,
    delete_jobs,
    fleet_cpu,
    last_seq,
    now_ms,
    put_jobs,
    read_stream,
    sleep_until,
    stores_for,
)

EVERY_SECOND = "* * * * * *"
NATIVE_STREAM = "BENCH_NATIVE"
NATIVE_PREFIX = "natsched"


@dataclass
class Run:
    """One measured configuration: who fired, where, with or without spread."""

    scheduler: str  # "hrwcron" or "native"
    deployment: str  # "single" or "R3"
    spread: bool
    jobs: int
    seconds: int
    lateness_ms: list[float] = field(default_factory=list)
    expected: int = 0
    note: str = ""
    # hrwcron only: CPU seconds of the replicas over the measured window, summed, and each
    # replica's own.
    cpu_s: float = math.nan
    replica_cpu_s: list[float] = field(default_factory=list)
    replicas: int = 3

    @property
    def tick_cost_us(self) -> float:
        """Replica CPU per trigger over the window, summed over the replicas, in µs."""
        count = len(self.lateness_ms)
        return self.cpu_s / count * 1e6 if count else math.nan

    @property
    def busiest_cost_us(self) -> float:
        """The busiest replica's CPU per trigger of the fleet's, in µs: what saturates first."""
        count = len(self.lateness_ms)
        return max(self.replica_cpu_s, default=math.nan) / count * 1e6 if count else math.nan

    @property
    def summary(self) -> Summary:
        return Summary.of(self.lateness_ms)

    @property
    def missing(self) -> int:
        return self.expected - len(self.lateness_ms)

    @property
    def label(self) -> str:
        return f"{self.scheduler} {self.deployment} {'spread' if self.spread else 'aligned'}"


def _window(start_s: int, seconds: int) -> tuple[int, int]:
    return start_s * 1000, (start_s + seconds) * 1000


async def hrwcron_runs(
    dep: Deployment, jobs: int, seconds: int, warmup: int, log: object
) -> list[Run]:
    """Both variants on one fleet of 3 replicas (each variant's jobs alone in the bucket)."""
    variants = [("spread", jobs, True), ("aligned", jobs, False)]
    return await hrwcron_fleet_runs(dep, variants, seconds, warmup, log)


async def hrwcron_fleet_runs(
    dep: Deployment,
    variants: list[tuple[str, int, bool]],
    seconds: int,
    warmup: int,
    log: object,
    *,
    replicas: int = 3,
    holders: int = 0,
) -> list[Run]:
    """One run per ``(tag, jobs, spread)`` on one fleet of ``replicas`` (each holding every job,
    or with ``holders`` a share), each run's jobs (named ``p-<tag>-<i>``) alone in the bucket."""
    config = dep.config()
    stores = await stores_for(config)
    fleet = dep.fleet(f"precision-{replicas}-{holders}", HRWCRON_SCHEDULER_HOLDERS=str(holders))
    runs: list[Run] = []
    try:
        fleet.start(replicas)
        await fleet.wait_ready(timeout=90)
        await fleet.wait_members([r.node for r in fleet.members])
        js = stores.client.jetstream()
        stream = config.scheduler.stream
        for tag, jobs, spread in variants:
            jitter = 1.0 if spread else 0.0
            specs = [
                JobSpec(name=f"p-{tag}-{i}", schedule=EVERY_SECOND, jitter=jitter)
                for i in range(jobs)
            ]
            first_seq = await last_seq(js, stream) + 1
            await put_jobs(stores, specs)
            start_s = math.ceil(now_ms() / 1000) + warmup
            begin, end = _window(start_s, seconds)
            await sleep_until(begin)
            cpu_begin = [fleet_cpu([r]) for r in fleet.members]
            await sleep_until(end)
            replica_cpu = [
                fleet_cpu([r]) - b for r, b in zip(fleet.members, cpu_begin, strict=True)
            ]
            # Wait out the window plus the slowest plausible trigger before reading.
            await sleep_until(end + 1000 + 2000)
            await delete_jobs(stores, [s.name for s in specs])
            stored = await read_stream(
                js, stream, f"{config.scheduler.subject_prefix}.>", start_seq=first_seq
            )
            run = Run("hrwcron", dep.kind, spread, jobs, seconds, expected=jobs * seconds)
            run.lateness_ms = _hrwcron_lateness(stored, jitter, begin, end)
            run.cpu_s = sum(replica_cpu)
            run.replica_cpu_s = replica_cpu
            run.replicas = replicas
            runs.append(run)
            log(f"  {run.label} {jobs:,}: {_brief(run)}")  # type: ignore[operator]
    finally:
        fleet.stop()
        await stores.client.close()
    return runs


def _hrwcron_lateness(stored: list[Stored], jitter: float, begin: float, end: float) -> list[float]:
    out = []
    offsets: dict[str, int] = {}
    for msg in stored:
        job = msg.headers.get(HEADER_JOB, "")
        due = int(msg.headers.get(HEADER_WATERMARK, "0"))
        if not begin <= due < end:
            continue
        if job not in offsets:
            offsets[job] = jitter_ms(job, jitter)
        out.append(msg.stored_ms - (due + offsets[job]))
    return out


def _brief(run: Run) -> str:
    s = run.summary
    cost = "" if math.isnan(run.tick_cost_us) else f", tick cost {run.tick_cost_us:.0f} µs"
    return (
        f"{s.count}/{run.expected} triggers, p50 {s.p50:.1f} ms, p99 {s.p99:.1f} ms, "
        f"max {s.max:.1f} ms{cost}"
    )


# ------------------------------------------------------------------------------ native


def _rfc3339(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms // 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


async def native_runs(
    dep: Deployment, jobs: int, seconds: int, warmup: int, log: object
) -> list[Run]:
    """The server's own scheduler: ``@every 1s`` schedules for the aligned case; for the spread
    case one-shot ``@at`` schedules at each job's instants, since ``@every`` and cron patterns
    only fire on whole seconds."""
    return await native_variant_runs(dep, [(jobs, True), (jobs, False)], seconds, warmup, log)


async def native_variant_runs(
    dep: Deployment,
    variants: list[tuple[int, bool]],
    seconds: int,
    warmup: int,
    log: object,
) -> list[Run]:
    """One native run per ``(jobs, spread)``, each on a stream of its own."""
    nc = await connect(dep.url)
    js = nc.jetstream()
    runs: list[Run] = []
    try:
        for jobs, spread in variants:
            with_stream = await _native_stream(js, dep.replicas)
            if not with_stream:
                raise RuntimeError("could not create a stream with allow_msg_schedules")
            run = Run("native", dep.kind, spread, jobs, seconds, expected=jobs * seconds)
            if spread:
                await _native_spread(js, run, warmup)
            else:
                await _native_aligned(js, run, warmup)
            await js.delete_stream(NATIVE_STREAM)
            runs.append(run)
            log(f"  {run.label} {jobs:,}: {_brief(run)}")  # type: ignore[operator]
    finally:
        await nc.close()
    return runs


async def _native_stream(js: object, replicas: int) -> bool:
    config = StreamConfig(
        name=NATIVE_STREAM,
        subjects=[f"{NATIVE_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=replicas,
        allow_rollup_hdrs=True,
        allow_msg_schedules=True,
        duplicate_window=600.0,
    )
    info = await js.add_stream(config)  # type: ignore[attr-defined]
    return bool(info.config.allow_msg_schedules)


async def _publish_all(js: object, items: list[tuple[str, bytes, dict[str, str]]]) -> None:
    slots = asyncio.Semaphore(256)

    async def one(subject: str, body: bytes, headers: dict[str, str]) -> None:
        async with slots:
            await js.publish(subject, body, headers=headers, stream=NATIVE_STREAM)  # type: ignore[attr-defined]

    await asyncio.gather(*(one(*item) for item in items))


async def _native_aligned(js: object, run: Run, warmup: int) -> None:
    items = [
        (
            f"{NATIVE_PREFIX}.def.{i}",
            json.dumps({"job": i}).encode(),
            {"Nats-Schedule": "@every 1s", "Nats-Schedule-Target": f"{NATIVE_PREFIX}.fire.{i}"},
        )
        for i in range(run.jobs)
    ]
    await _publish_all(js, items)
    start_s = math.ceil(now_ms() / 1000) + warmup
    begin, end = _window(start_s, run.seconds)
    await sleep_until(end + 3000)
    # Stop the schedules before reading, so the read has an end.
    await js.purge_stream(NATIVE_STREAM, subject=f"{NATIVE_PREFIX}.def.>")  # type: ignore[attr-defined]
    stored = await read_stream(js, NATIVE_STREAM, f"{NATIVE_PREFIX}.fire.>")  # type: ignore[arg-type]
    lateness = []
    for msg in stored:
        # Nats-Schedule-Next is the following firing; @every 1s fires on whole seconds, so this
        # firing was due one interval before it.
        following = msg.headers.get("Nats-Schedule-Next", "")
        if not following or following == "purge":
            continue
        due = _parse_rfc3339_ms(following) - 1000
        if begin <= due < end:
            lateness.append(msg.stored_ms - due)
    run.lateness_ms = lateness


async def _native_spread(js: object, run: Run, warmup: int) -> None:
    names = [f"p-spread-{i}" for i in range(run.jobs)]
    offsets = [jitter_ms(name, 1.0) for name in names]
    # Every instant must be scheduled before it comes: publishing takes time, so the window
    # starts after a generous estimate of it, and instants already past are left out.
    lead = warmup + 2 + math.ceil(run.jobs * run.seconds / 1500)
    start_s = math.ceil(now_ms() / 1000) + lead
    begin, end = _window(start_s, run.seconds)
    items = []
    for i, offset in enumerate(offsets):
        for s in range(run.seconds):
            due = begin + s * 1000 + offset
            items.append(
                (
                    f"{NATIVE_PREFIX}.def.{i}.{s}",
                    json.dumps({"due_ms": due}).encode(),
                    {
                        "Nats-Schedule": f"@at {_rfc3339(due)}",
                        "Nats-Schedule-Target": f"{NATIVE_PREFIX}.fire.{i}",
                    },
                )
            )
    await _publish_all(js, items)
    published = now_ms()
    if published > begin:
        run.note = f"scheduling took until {published - begin:.0f} ms into the window"
    await sleep_until(end + 3000)
    stored = await read_stream(
        js,  # type: ignore[arg-type]
        NATIVE_STREAM,
        f"{NATIVE_PREFIX}.fire.>",
        headers_only=False,
    )
    lateness = []
    for msg in stored:
        due = json.loads(msg.data)["due_ms"]
        if begin <= due < end and due > published:
            lateness.append(msg.stored_ms - due)
    run.lateness_ms = lateness


def _parse_rfc3339_ms(text: str) -> int:
    # Go's RFC 3339 with nanoseconds; Python's fromisoformat takes at most microseconds.
    head, _, rest = text.partition(".")
    if rest:
        digits = rest.rstrip("Z")
        frac = int((digits + "000")[:3])
    else:
        head = head.rstrip("Z")
        frac = 0
    moment = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1000 + frac
