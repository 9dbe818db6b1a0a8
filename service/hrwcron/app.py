"""Composition: the one place that knows the concrete classes and wires a replica together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from nats.aio.client import Client

from .admin.service import AdminService
from .clock import Clock
from .config import Config
from .config import default_node_id as host_node_id
from .errors import HrwcronError
from .failpoints import Failpoints
from .http import HttpServer
from .jetstream.connect import connect
from .jetstream.kv import JetStreamClaims, JetStreamJobs, JetStreamMembers, JetStreamRuns
from .jetstream.provision import Layout, provision
from .jetstream.triggers import JetStreamTriggers
from .jobsync import apply_diff, diff_jobs
from .model import DEFAULT_MAX_LATENESS
from .ports import NullObserver, Observer
from .scheduler import Scheduler, Settings
from .status import ReplicaStatus
from .telemetry import Telemetry

log = logging.getLogger("hrwcron.app")


def node_id(config: Config) -> str:
    return config.scheduler.node_id or host_node_id()


def layout(config: Config) -> Layout:
    s = config.scheduler
    return Layout(
        members_bucket=s.members_bucket,
        claims_bucket=s.claims_bucket,
        jobs_bucket=s.jobs_bucket,
        runs_bucket=s.runs_bucket,
        stream=s.stream,
        subject_prefix=s.subject_prefix,
        member_ttl=s.member_ttl,
        duplicate_window=s.duplicate_window,
        stream_max_age=s.stream_max_age,
        replicas=s.replicas,
        storage=s.storage,
        claims_storage=s.claims_storage,
    )


def settings(config: Config) -> Settings:
    s = config.scheduler
    return Settings(
        node_id=node_id(config),
        weight=s.weight,
        tags=tuple(s.tags),
        heartbeat_interval=s.heartbeat_interval,
        member_ttl=s.member_ttl,
        membership_refresh=s.membership_refresh,
        failover_step=s.failover_step,
        claim_lease=s.claim_lease,
        max_clock_skew=s.max_clock_skew,
        subject_prefix=s.subject_prefix,
        max_payload=s.max_payload,
        max_in_flight=s.max_in_flight,
        shutdown_timeout=s.shutdown_timeout,
        http_address=config.http.listen,
    )


@dataclass
class Stores:
    """The JetStream-backed ports of one connection."""

    client: Client
    members: JetStreamMembers
    claims: JetStreamClaims
    jobs: JetStreamJobs
    runs: JetStreamRuns
    triggers: JetStreamTriggers


async def open_stores(config: Config, *, provision_missing: bool = True) -> Stores:
    """Connect, check the server, create or verify the buckets and stream, bind the ports."""
    client = await connect(config.nats)
    try:
        js = client.jetstream()
        shape = layout(config)
        if provision_missing:
            longest = max([job.max_lateness for job in config.jobs] + [DEFAULT_MAX_LATENESS])
            await provision(js, shape, longest_lateness=longest)
        return Stores(
            client=client,
            members=JetStreamMembers(
                js, await js.key_value(shape.members_bucket), shape.members_bucket
            ),
            claims=JetStreamClaims(
                js, await js.key_value(shape.claims_bucket), shape.claims_bucket
            ),
            jobs=JetStreamJobs(js, await js.key_value(shape.jobs_bucket), shape.jobs_bucket),
            runs=JetStreamRuns(await js.key_value(shape.runs_bucket)),
            triggers=JetStreamTriggers(js, shape.stream, shape.subject_prefix),
        )
    except BaseException:
        await client.close()
        raise


@dataclass
class Replica:
    config: Config
    stores: Stores
    scheduler: Scheduler
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    admin: AdminService | None = None
    telemetry: Telemetry | None = None
    http: HttpServer | None = None

    async def stop(self) -> None:
        """Shutdown order: stop answering admin requests (the others answer them), stop
        claiming and finish in-flight publishes (bounded), leave the membership so others take
        over at once, then drain the connection."""
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await self.admin.stop()
        await self.scheduler.stop()
        # Closed after the scheduler, so probes see the replica until it has left.
        if self.http is not None:
            await self.http.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.stores.client.drain(), timeout=1.0)
        if self.telemetry is not None:
            await self.telemetry.shutdown()
        self.stopped.set()


async def start_replica(
    config: Config, env: Mapping[str, str], observer: Observer | None = None
) -> Replica:
    stores = await open_stores(config)
    http: HttpServer | None = None
    try:
        if config.scheduler.apply_jobs and config.jobs:
            diff = await diff_jobs(stores.jobs, config.jobs, prune=False)
            if not diff.empty:
                log.info("applying jobs from the config file: %s", ", ".join(diff.lines()))
                await apply_diff(stores.jobs, diff)
        clock = Clock()
        telemetry = observer if isinstance(observer, Telemetry) else None
        if observer is None:
            telemetry = Telemetry.from_config(
                config,
                node=node_id(config),
                env=env,
                now_ms=clock.now_ms,
                monotonic=clock.monotonic,
            )
        if telemetry is not None:
            telemetry.track_nats(stores.client)
        scheduler = Scheduler(
            settings(config),
            members=stores.members,
            claims=stores.claims,
            triggers=stores.triggers,
            jobs=stores.jobs,
            runs=stores.runs,
            observer=observer or telemetry or NullObserver(),
            clock=clock,
            failpoints=Failpoints(env),
        )
        if telemetry is not None and config.http.listen:
            # Up before the scheduler starts, so probes see "not ready" rather than nothing.
            client = stores.client
            source = ReplicaStatus(scheduler, telemetry, connected=lambda: client.is_connected)
            http = HttpServer(config.http.listen, registry=telemetry.registry, source=source)
            try:
                await http.start()
            except OSError as exc:
                where = config.http.listen
                raise HrwcronError(f"cannot listen on http.listen {where}: {exc}") from None
        await scheduler.start()
        if telemetry is not None:
            telemetry.history_loaded()
        admin = AdminService(
            stores.client,
            scheduler,
            stores.jobs,
            stores.triggers,
            duplicate_window=config.scheduler.duplicate_window,
        )
        try:
            await admin.start()
        except BaseException:
            await scheduler.stop()
            raise
    except BaseException:
        if http is not None:
            await http.close()
        await stores.client.close()
        raise
    log.info("replica %s started (instance %s)", scheduler.node, scheduler.instance)
    return Replica(config, stores, scheduler, admin=admin, telemetry=telemetry, http=http)


async def serve(config: Config, env: Mapping[str, str]) -> int:
    """Run one replica until SIGTERM or SIGINT; returns the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        replica = await start_replica(config, env)
    except HrwcronError as exc:
        log.error("%s", exc)
        return 1
    fatal = asyncio.create_task(replica.scheduler.failed.wait())
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({fatal, waiter}, return_when=asyncio.FIRST_COMPLETED)
    fatal.cancel()
    waiter.cancel()
    log.info("stopping")
    await replica.stop()
    log.info("stopped")
    return 1 if replica.scheduler.fatal else 0
