"""A chaos world: replicas on a 3-node cluster (or a power cluster) with a fault schedule, and
what a run leaves to judge it by (lost replicas, tracebacks, the verdict). Shared by the chaos,
power and route tests."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client
from nats.errors import Error as NatsError

from harness import NatsCluster, wait_for_async
from harness.chaos import now_ms
from harness.evidence import tracebacks
from harness.power import PowerCluster
from hrwcron.core.config import Config
from hrwcron.core.model import JobSpec
from hrwcron.process.app import Stores, open_stores
from hrwcron.process.startup import start_with_retries

from .checker import Verdict, check_stream
from .faults import (
    Timings,
    World,
)
from .jobmix import chaos_jobs


@dataclass
class Run:
    world: World
    stores: Stores
    jobs: list[JobSpec]
    start_ms: float

    @property
    def client(self) -> Client:
        return self.stores.client

    async def verdict(self, end_ms: float) -> Verdict:
        window = (self.start_ms, end_ms)
        return await check_stream(self.client, self.jobs, window, acks=self.world.acks())

    def explain(self, verdict: Verdict) -> str:
        faults = "\n".join(
            f"{dt.datetime.fromtimestamp(f.start_ms / 1000):%T} {f}" for f in self.world.faults
        )
        return f"{verdict.table()}\n\nfaults:\n{faults}\n\n{self.world.fleet.dump_logs(60)}"


@contextlib.asynccontextmanager
async def chaos_world(
    tmp_path: Path,
    timings: Timings,
    *,
    faketime: bool,
    power_sync: str | None = None,
    span_s: float = 120.0,
    route_links: bool = False,
    holders: int = 0,
    server_clocks: bool = False,
) -> AsyncIterator[Run]:
    """With ``power_sync`` (``always``, ``default``), every NATS node's store is on a powerfs
    mount with that sync_interval, and the replicas keep an ack journal. With ``route_links``
    the servers' routes go through forwarders (for the faults in ``routes.py``); with
    ``server_clocks`` each server's wall clock can be moved (``server_clocks.py``). The jobs'
    windows and one-time instants are spread over ``span_s``, about how long the run lasts."""
    cluster: NatsCluster
    base = tmp_path / "cluster"
    if power_sync is None:
        cluster = NatsCluster(
            3,
            base_dir=base,
            no_advertise=True,
            route_links=route_links,
            server_clocks=server_clocks,
        )
    else:
        cluster = PowerCluster(
            3,
            sync=power_sync,
            base_dir=base,
            no_advertise=True,
            route_links=route_links,
            server_clocks=server_clocks,
        )
    await asyncio.to_thread(cluster.start)
    journal = power_sync is not None
    world = World(
        cluster,
        tmp_path / "world",
        timings,
        faketime=faketime,
        ack_journal=journal,
        holders=holders,
    )
    stores: Stores | None = None
    try:
        # R3 buckets and stream, as replicas make them; a cluster that has just formed can
        # still call a peer offline, which a replica's start-up would ride out too.
        stores = await stores_with_jobs(
            world.fleet.config(), jobs := chaos_jobs(timings, now_ms(), span_s)
        )
        await asyncio.to_thread(world.start)
        yield Run(world, stores, jobs, now_ms() + 2_000)
    finally:
        if stores is not None:
            await stores.client.close()
        world.close()
        cluster.cleanup()


async def stores_with_jobs(config: Config, jobs: list[JobSpec]) -> Stores:
    """The test's own connection to a cluster that has just formed, the buckets and stream
    made at the replicas' replication (as a replica's start-up would, riding out a peer still
    called offline), and ``jobs`` stored."""
    stores = await start_with_retries(lambda: open_stores(config), bound_s=60)
    for job in jobs:
        # A just-created replicated bucket answers once its stream has elected a leader.
        await wait_for_async(
            lambda job=job: stores.jobs.put(job, None),  # type: ignore[misc]
            timeout=60,
            interval=0.5,
            message=f"job {job.name} stored",
            ignore=(NatsError, TimeoutError),
        )
    return stores


# --- make test: the bounded scenario -----------------------------------------------------------


async def judged(run: Run, *, min_ticks: int) -> set[str]:
    """Check the stream, the replicas' logs and the tick count; the kinds of fault done."""
    verdict = await run.verdict(now_ms() - 1_000)
    print(verdict.table())
    assert verdict.ok, run.explain(verdict)
    lost = replicas_lost(run.world)
    assert lost == [], "\n".join(lost) + "\n\n" + tracebacks_in_full(run.world)
    assert verdict.ticks > min_ticks
    return {f.kind for f in run.world.faults}


def replicas_lost(world: World) -> list[str]:
    """Log lines of replicas that went down on their own (a connection closed for good, a
    crash) rather than by a fault's hand: a traceback as the record that logged it, the
    exception raised and what it was raised from (``<-``)."""
    lost = []
    for node, text in _replica_logs(world):
        lost += [f"{node}: {line}" for line in text.splitlines() if "closed for good" in line]
        lost += [f"{node}: {found.summary()}" for found in tracebacks(text)]
    return lost


def tracebacks_in_full(world: World, most_lines: int = 80) -> str:
    """Every replica traceback as logged, for a failure message."""
    parts = []
    for node, text in _replica_logs(world):
        for found in tracebacks(text):
            lines = found.text.splitlines()
            shown = "\n".join(lines[:most_lines])
            more = f"\n... {len(lines) - most_lines} more lines" if len(lines) > most_lines else ""
            parts.append(f"----- {node}: {found.logged}\n{shown}{more}")
    return "\n".join(parts)


def rode_out(world: World) -> int:
    """Starts that met JetStream not serving and retried until it did."""
    return sum(text.count("start-up: JetStream served after") for _, text in _replica_logs(world))


def _replica_logs(world: World) -> list[tuple[str, str]]:
    found = []
    for node in world.fleet.nodes:
        path = world.fleet.log_dir / f"{node}.log"
        if path.exists():
            found.append((node, path.read_text(errors="replace")))
    return found


# --- make test: clocks -------------------------------------------------------------------------
