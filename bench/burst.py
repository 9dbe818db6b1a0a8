"""Burst: K jobs due on the same second on 3 replicas, against the floor measured in the same run
(one process publishing K messages with ``Nats-Msg-Id`` into an identical stream, as many in
flight as helps), and the same herd spread by jitter.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from hrwcron.adapters.jetstream.pipeline import JetStreamPipeline, PubAck
from hrwcron.core.model import JobSpec
from hrwcron.core.schedule import jitter_ms
from hrwcron.engine.ports import HEADER_JOB, HEADER_WATERMARK

from .common import (
    Deployment,
    Replica,
    Summary,
    connect,
    delete_jobs,
    fleet_cpu,
    last_seq,
    now_ms,
    percentile,
    put_jobs,
    read_stream,
    sleep_until,
    stores_for,
    until,
)

FLOOR_STREAM = "BENCH_FLOOR"
FLOOR_WINDOWS = (64, 256, 1024)
# The pipelined core path: batches of this many publishes written at once, then awaited.
PIPELINE_WINDOWS = (256, 1024)
PUBLISH = "JetStreamContext.publish"
PIPELINED = "pipelined core publish"
# Claim operations a herd may cost beyond one create per tick (the target: < 5%).
CLAIM_OPS = ("claim_ops:create", "claim_ops:read", "claim_ops:replace")


@dataclass
class Floor:
    in_flight: int
    seconds: float
    method: str = PUBLISH


@dataclass
class BurstResult:
    jobs: int
    deployment: str
    floors: list[Floor] = field(default_factory=list)
    # Herd: offsets (ms) of each trigger's stored time from the common due instant.
    herd_ms: list[float] = field(default_factory=list)
    herd_note: str = ""
    jitter_s: float = 0.0
    spread_lateness_ms: list[float] = field(default_factory=list)
    spread_stored_ms: list[float] = field(default_factory=list)
    spread_note: str = ""
    floor_curve_ms: list[float] = field(default_factory=list)
    # Tick outcomes and claim contention summed over the 3 replicas' metrics, per burst.
    herd_outcomes: dict[str, float] = field(default_factory=dict)
    spread_outcomes: dict[str, float] = field(default_factory=dict)
    # Replica CPU seconds, summed over the 3 replicas, from just before the due instant to
    # just after the last trigger of the burst (plus the failover step the others wait).
    herd_cpu_s: float = math.nan
    spread_cpu_s: float = math.nan

    @property
    def tick_cost_us(self) -> float:
        """Replica CPU per trigger of the herd, summed over the replicas, in µs."""
        return self.herd_cpu_s / len(self.herd_ms) * 1e6 if self.herd_ms else math.nan

    @property
    def spread_tick_cost_us(self) -> float:
        count = len(self.spread_lateness_ms)
        return self.spread_cpu_s / count * 1e6 if count else math.nan

    @property
    def claim_ops_beyond(self) -> float:
        """Claim writes and reads in the herd beyond one per trigger, as a share of triggers."""
        ops = sum(self.herd_outcomes.get(k, 0.0) for k in CLAIM_OPS)
        if not self.herd_ms or not ops:
            return math.nan
        return (ops - len(self.herd_ms)) / len(self.herd_ms)

    @property
    def floor(self) -> Floor:
        return min(self.floors, key=lambda f: f.seconds)

    @property
    def last_ack_s(self) -> float:
        return max(self.herd_ms) / 1000 if self.herd_ms else math.nan

    @property
    def peak_rate(self) -> tuple[int, float]:
        """The most triggers stored in one 1-second window, and the mean rate over the spread."""
        if not self.spread_stored_ms:
            return 0, math.nan
        times = sorted(self.spread_stored_ms)
        best, lo = 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] >= 1000:
                lo += 1
            best = max(best, hi - lo + 1)
        return best, len(times) / self.jitter_s


FLOOR_BODY = b'{"v":1,"job":"floor","tick":"floor:0","payload":null}'


async def _timed_floor(
    dep: Deployment, count: int, send: Callable[[Client], Awaitable[None]]
) -> tuple[float, list[float]]:
    """Seconds from the first publish to the last of ``count`` messages stored, and each one's
    offset (ms), when ``send`` publishes them into a stream configured like the trigger
    stream. Measured like the herd: the last ack would only add the round trip back."""
    nc = await connect(dep.url)
    js = nc.jetstream()
    try:
        await js.add_stream(
            StreamConfig(
                name=FLOOR_STREAM,
                subjects=["benchfloor.>"],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                num_replicas=dep.replicas,
                duplicate_window=600.0,
                discard=DiscardPolicy.OLD,
                allow_direct=True,
            )
        )
        began_wall = now_ms()
        await send(nc)
        stored = await read_stream(js, FLOOR_STREAM, "benchfloor.>")
        await js.delete_stream(FLOOR_STREAM)
        if len(stored) != count:
            raise RuntimeError(f"floor stream holds {len(stored)} of {count} messages")
        curve = [m.stored_ms - began_wall for m in stored]
        return max(curve) / 1000, curve
    finally:
        await nc.close()


async def _floor(dep: Deployment, count: int, in_flight: int) -> tuple[float, list[float]]:
    """The floor through ``JetStreamContext.publish``, ``in_flight`` tasks at a time."""

    async def send(nc: Client) -> None:
        js = nc.jetstream()
        slots = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            async with slots:
                await js.publish(
                    f"benchfloor.job-{i}", FLOOR_BODY, headers={"Nats-Msg-Id": f"job-{i}:0"}
                )

        await asyncio.gather(*(one(i) for i in range(count)))

    return await _timed_floor(dep, count, send)


async def _pipelined_floor(dep: Deployment, count: int, window: int) -> tuple[float, list[float]]:
    """The floor through hrwcron's pipelined path: ``window`` publishes written in one go,
    their acknowledgements awaited, the next ``window`` after them."""

    def acked(ack: PubAck) -> int:
        if ack.error is not None:
            raise RuntimeError(f"floor publish refused: {ack.error.description}")
        return ack.seq

    async def send(nc: Client) -> None:
        pipeline = JetStreamPipeline(nc, timeout=60)
        for start in range(0, count, window):
            batch = [
                (f"benchfloor.job-{i}", FLOOR_BODY, {"Nats-Msg-Id": f"job-{i}:0"})
                for i in range(start, min(count, start + window))
            ]
            await asyncio.gather(*await pipeline.publish_many(batch, acked))

    return await _timed_floor(dep, count, send)


async def run(dep: Deployment, jobs: int, jitter_s: float, log: object) -> BurstResult:
    result = BurstResult(jobs=jobs, deployment=dep.kind, jitter_s=jitter_s)
    config = dep.config()
    stores = await stores_for(config)
    fleet = dep.fleet("burst")
    js = stores.client.jetstream()
    stream = config.scheduler.stream
    subjects = f"{config.scheduler.subject_prefix}.>"
    try:
        # The fastest way one process gets as many messages with Msg-Id stored: nats-py's
        # JetStream publish at its best concurrency, or the pipelined core path; best counts.
        for method, windows, measure in (
            (PUBLISH, FLOOR_WINDOWS, _floor),
            (PIPELINED, PIPELINE_WINDOWS, _pipelined_floor),
        ):
            for window in windows:
                took, curve = await measure(dep, jobs, window)
                result.floors.append(Floor(window, took, method))
                if result.floor.seconds == took:
                    result.floor_curve_ms = curve
        log(  # type: ignore[operator]
            "  floor: "
            + ", ".join(
                f"{f.method} {f.in_flight} in flight {f.seconds:.2f} s" for f in result.floors
            )
        )
        fleet.start(3)
        await fleet.wait_ready(timeout=90)
        await fleet.wait_members([r.node for r in fleet.members])

        for spread in (False, True):
            tag = "spread" if spread else "herd"
            # The instant is chosen before the jobs are written, so leave time for writing K
            # jobs and for every replica to load them; checked below.
            due_s = math.ceil(now_ms() / 1000) + 8 + math.ceil(jobs / 400)
            moment = datetime.fromtimestamp(due_s, tz=UTC)
            schedule = f"{moment.second} {moment.minute} * * * *"
            specs = [
                JobSpec(
                    name=f"b-{tag}-{i}",
                    schedule=schedule,
                    jitter=jitter_s if spread else 0.0,
                    max_lateness=600.0,
                )
                for i in range(jobs)
            ]
            first_seq = await last_seq(js, stream) + 1
            before = await _counters(fleet.members)
            await put_jobs(stores, specs, limit=512)
            loaded = await _all_loaded(stores, jobs, fleet.members, due_s * 1000 - 500)
            note = "" if loaded else "not every replica had loaded the jobs before they were due"
            await sleep_until(due_s * 1000 - 300)
            cpu_before = fleet_cpu(fleet.members)
            end_ms = due_s * 1000 + (jitter_s * 1000 if spread else 0)
            expected_done = end_ms + 2000 + jobs  # about 1 ms a trigger at the very worst
            await until(
                lambda fs=first_seq: _count(js, stream, fs, jobs),
                timeout=max(30.0, (expected_done - now_ms()) / 1000 + 60),
                what=f"{jobs} triggers of the {tag} burst",
                interval=0.5,
            )
            stored = await read_stream(js, stream, subjects, start_seq=first_seq)
            # Retries and late wake-ups of the other candidates come a little after the
            # last trigger; give them a failover step to be counted.
            await asyncio.sleep(1.5)
            cpu_s = fleet_cpu(fleet.members) - cpu_before
            after = await _counters(fleet.members)
            outcomes = {k: v - before.get(k, 0.0) for k, v in after.items()}
            outcomes = {k: v for k, v in outcomes.items() if v}
            due_ms = due_s * 1000
            if spread:
                result.spread_note = note
                result.spread_outcomes = outcomes
                result.spread_cpu_s = cpu_s
                result.spread_stored_ms = [m.stored_ms for m in stored]
                result.spread_lateness_ms = [
                    m.stored_ms
                    - int(m.headers[HEADER_WATERMARK])
                    - jitter_ms(m.headers[HEADER_JOB], jitter_s)
                    for m in stored
                ]
                peak, mean = result.peak_rate
                s = Summary.of(result.spread_lateness_ms)
                log(  # type: ignore[operator]
                    f"  spread over {jitter_s:g} s: peak {peak}/s (mean {mean:.0f}/s), "
                    f"lateness p50 {s.p50:.1f} p99 {s.p99:.1f} max {s.max:.1f} ms"
                )
            else:
                result.herd_note = note
                result.herd_outcomes = outcomes
                result.herd_cpu_s = cpu_s
                result.herd_ms = [m.stored_ms - due_ms for m in stored]
                log(  # type: ignore[operator]
                    f"  herd of {jobs}: last stored {result.last_ack_s:.2f} s after due "
                    f"(p50 {percentile(result.herd_ms, 50):.0f} ms) vs floor "
                    f"{result.floor.seconds:.2f} s; tick cost {result.tick_cost_us:.0f} µs; "
                    f"{outcomes}"
                )
            await delete_jobs(stores, [s.name for s in specs], limit=512)
    finally:
        fleet.stop()
        await stores.client.close()
    return result


async def _counters(replicas: list[Replica]) -> dict[str, float]:
    total: dict[str, float] = {}
    for replica in replicas:
        for key, value in (await asyncio.to_thread(replica.metrics)).items():
            total[key] = total.get(key, 0.0) + value
    return total


async def _count(js: object, stream: str, first_seq: int, wanted: int) -> bool:
    return await last_seq(js, stream) - first_seq + 1 >= wanted  # type: ignore[arg-type]


async def _all_loaded(stores: object, jobs: int, replicas: object, deadline_ms: float) -> bool:
    """Whether every replica's heartbeat reported at least ``jobs`` jobs before the deadline."""
    nodes = [r.node for r in replicas]  # type: ignore[attr-defined]
    while now_ms() < deadline_ms:
        members = await stores.members.snapshot()  # type: ignore[attr-defined]
        counts = [members[n].heartbeat.jobs if n in members else 0 for n in nodes]
        if all(c >= jobs for c in counts):
            return True
        await asyncio.sleep(0.2)
    return False
