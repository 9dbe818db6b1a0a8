"""Durability's price: the same measurements on servers with nats-server's default
``sync_interval`` (a flush every two minutes) and with ``sync_interval: always`` (a flush
before every acknowledgement, as the shipped configurations set it), side by side in one run.

* **throughput**: one process publishing with ``Nats-Msg-Id`` into a trigger-like stream,
  pipelined (256 in flight), single node and 3-node cluster;
* **claims**: create-only claim writes with a per-key TTL, as a replica makes them, into a
  memory bucket and into a file bucket, single node and cluster: what claims in memory save;
* **precision**: hrwcron's every-second jobs on 3 replicas over the 3-node cluster (the
  production shape), spread and aligned, as in the precision section;
* **herd**: the burst section's herd and spread, with its own floor, on a single node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from hrwcron.adapters.jetstream.kv import conditional_put
from hrwcron.core.model import ClaimRecord, encode

from . import burst, precision
from .common import SYNCS, Deployment, connect, gather_limited

STREAM = "BENCH_SYNC"
IN_FLIGHT = 256
CLAIM_TTL_S = 75.0  # what a replica gives a claim of a job with the default lateness


@dataclass
class SyncRun:
    """Everything measured on servers with one ``sync`` setting."""

    sync: str
    publish_per_s: dict[str, float] = field(default_factory=dict)  # deployment -> msgs/s
    # (deployment, storage) -> creates/s
    claims_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    precision: list[precision.Run] = field(default_factory=list)
    burst: burst.BurstResult | None = None


@dataclass
class DurabilityResult:
    publishes: int
    claims: int
    runs: list[SyncRun] = field(default_factory=list)

    def of(self, sync: str) -> SyncRun | None:
        return next((run for run in self.runs if run.sync == sync), None)


async def publish_rate(dep: Deployment, count: int) -> float:
    """Messages per second, ``count`` publishes with Msg-Id, ``IN_FLIGHT`` at a time."""
    nc = await connect(dep.url)
    js = nc.jetstream()
    try:
        await js.add_stream(
            StreamConfig(
                name=STREAM,
                subjects=["benchsync.>"],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                num_replicas=dep.replicas,
                duplicate_window=600.0,
                discard=DiscardPolicy.OLD,
            )
        )
        body = b'{"v":1,"job":"sync","tick":"sync:0","payload":null}'
        began = time.perf_counter()
        await gather_limited(
            (
                js.publish(f"benchsync.job-{i % 1000}", body, headers={"Nats-Msg-Id": f"s:{i}"})
                for i in range(count)
            ),
            IN_FLIGHT,
        )
        took = time.perf_counter() - began
        await js.delete_stream(STREAM)
        return count / took
    finally:
        await nc.close()


async def claim_rate(dep: Deployment, count: int, storage: StorageType) -> float:
    """Create-only claim writes per second into a bucket of ``storage``, ``IN_FLIGHT`` at a
    time, each key new (every tick has its own claim)."""
    nc = await connect(dep.url)
    js = nc.jetstream()
    bucket = f"bench_claims_{storage.value}"
    record = encode(ClaimRecord(node="bench", instance="bench", attempt=1, claimed_ms=0))
    try:
        await js.create_key_value(
            config=KeyValueConfig(bucket=bucket, history=1, storage=storage, replicas=dep.replicas)
        )
        began = time.perf_counter()
        revisions = await gather_limited(
            (
                conditional_put(js, bucket, f"job-{i % 1000}:{i}", record, 0, CLAIM_TTL_S)
                for i in range(count)
            ),
            IN_FLIGHT,
        )
        took = time.perf_counter() - began
        await js.delete_key_value(bucket)
        if any(r is None for r in revisions):
            raise RuntimeError(f"a new claim key was refused in {bucket}")
        return count / took
    finally:
        await nc.close()


async def run(
    size: dict[str, int], warmup: int, log: object, syncs: tuple[str, ...] = SYNCS
) -> DurabilityResult:
    result = DurabilityResult(publishes=size["sync_publishes"], claims=size["sync_claims"])
    for sync in syncs:
        found = SyncRun(sync)
        result.runs.append(found)
        for kind in ("single", "R3"):
            dep = await Deployment(kind, sync).start()
            try:
                rate = await publish_rate(dep, result.publishes)
                found.publish_per_s[kind] = rate
                log(f"  {sync} {kind}: {rate:,.0f} publishes/s")  # type: ignore[operator]
                for storage in (StorageType.MEMORY, StorageType.FILE):
                    claims = await claim_rate(dep, result.claims, storage)
                    found.claims_per_s[(kind, storage.value)] = claims
                    log(f"  {sync} {kind} claims, {storage.value}: {claims:,.0f}/s")  # type: ignore[operator]
                if kind == "R3":
                    found.precision = await precision.hrwcron_runs(
                        dep, size["precision_jobs"], size["precision_seconds"], warmup, log
                    )
                else:
                    found.burst = await burst.run(
                        dep, size["burst_jobs"], size["burst_jitter"], log
                    )
            finally:
                await dep.stop()
    return result
