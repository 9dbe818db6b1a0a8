"""Composition: the one place that knows the concrete classes and wires a replica together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.errors import Error as NatsError

from hrwcron.adapters.http import HttpServer
from hrwcron.adapters.jetstream.claims import JetStreamClaims, JetStreamRuns
from hrwcron.adapters.jetstream.connect import ConnectionHooks, connect, drain_within
from hrwcron.adapters.jetstream.counts_bucket import JetStreamCounts
from hrwcron.adapters.jetstream.jobs import WATCH_SETUP_S, JetStreamJobs, has_lanes
from hrwcron.adapters.jetstream.marks import NatsMarks
from hrwcron.adapters.jetstream.members import JetStreamMembers
from hrwcron.adapters.jetstream.pipeline import JetStreamPipeline
from hrwcron.adapters.jetstream.provision import Layout, provision
from hrwcron.adapters.jetstream.triggers import JetStreamTriggers
from hrwcron.adapters.telemetry import Telemetry
from hrwcron.admin.service import AdminService
from hrwcron.admin.status import ReplicaStatus
from hrwcron.console import Console
from hrwcron.console.auth import Auth, parse_users
from hrwcron.core.config import Config
from hrwcron.core.errors import HrwcronError, NatsSetupError
from hrwcron.core.model import DEFAULT_MAX_LATENESS, TRIGGER_ENVELOPE
from hrwcron.engine.clock import Clock
from hrwcron.engine.failpoints import Failpoints
from hrwcron.engine.jobsync import apply_at_start
from hrwcron.engine.ports import NullObserver, Observer, StoreUnavailable
from hrwcron.engine.scheduler import Scheduler, Settings
from hrwcron.process.host import node_id as node_id
from hrwcron.process.startup import refused, start_with_retries

log = logging.getLogger("hrwcron.app")


def layout(config: Config) -> Layout:
    s = config.scheduler
    return Layout(
        members_bucket=s.members_bucket,
        claims_bucket=s.claims_bucket,
        jobs_bucket=s.jobs_bucket,
        runs_bucket=s.runs_bucket,
        counts_bucket=s.counts_bucket,
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
        cloudevents_source=s.events_source,
        holders=s.holders,
    )


def check_max_payload(job_payload: int, server_payload: int) -> None:
    """A trigger is a job's payload plus its envelope; nats-server resets a connection that
    publishes more than its max_payload, so a config that allows bigger ones is refused."""
    if job_payload + TRIGGER_ENVELOPE > server_payload:
        raise NatsSetupError(
            f"scheduler.max_payload is {job_payload} bytes: with a trigger's envelope "
            f"({TRIGGER_ENVELOPE} bytes) a trigger could be larger than the NATS server's "
            f"max_payload ({server_payload} bytes); lower scheduler.max_payload to at most "
            f"{max(0, server_payload - TRIGGER_ENVELOPE)} or raise max_payload in nats-server"
        )


def console(
    config: Config,
    scheduler: Scheduler,
    status: ReplicaStatus,
    telemetry: Telemetry,
    admin: AdminService,
) -> Console:
    """The pages on the HTTP endpoint; they act through ``admin``, as the CLI does."""
    h = config.http
    auth = Auth(
        users=parse_users(h.users),
        status_token=h.status_token,
        trusted_header=h.trusted_header,
        trusted_proxies=h.trusted_proxies,
        clock=scheduler.clock.monotonic,
    )
    return Console(scheduler, status, telemetry, admin, auth)


@dataclass
class Stores:
    """The JetStream-backed ports of one connection."""

    client: Client
    members: JetStreamMembers
    claims: JetStreamClaims
    jobs: JetStreamJobs
    runs: JetStreamRuns
    triggers: JetStreamTriggers
    counts: JetStreamCounts
    marks: NatsMarks
    hooks: ConnectionHooks = field(default_factory=ConnectionHooks)


async def open_stores(config: Config, *, provision_missing: bool = True) -> Stores:
    """Connect, check the server, create or verify the buckets and stream, bind the ports."""
    hooks = ConnectionHooks()
    client = await connect(config.nats, hooks=hooks)
    pipeline = JetStreamPipeline(client)
    hooks.disconnected.append(pipeline.connection_lost)
    try:
        check_max_payload(config.scheduler.max_payload, client.max_payload)
        js = client.jetstream()
        shape = layout(config)
        if provision_missing:
            longest = max([job.max_lateness for job in config.jobs] + [DEFAULT_MAX_LATENESS])
            await provision(js, shape, longest_lateness=longest)
        return Stores(
            client=client,
            hooks=hooks,
            members=JetStreamMembers(
                js, await js.key_value(shape.members_bucket), shape.members_bucket
            ),
            claims=JetStreamClaims(
                js, await js.key_value(shape.claims_bucket), shape.claims_bucket, pipeline
            ),
            jobs=JetStreamJobs(
                js,
                await js.key_value(shape.jobs_bucket),
                shape.jobs_bucket,
                claims_bucket=shape.claims_bucket,
                subject_prefix=shape.subject_prefix,
                pipeline=pipeline,
                lanes=await has_lanes(js, shape.jobs_bucket),
                watch_js=client.jetstream(timeout=WATCH_SETUP_S),
            ),
            runs=JetStreamRuns(await js.key_value(shape.runs_bucket)),
            triggers=JetStreamTriggers(js, shape.stream, shape.subject_prefix, pipeline),
            marks=NatsMarks(client, config.scheduler.marks_subject),
            counts=JetStreamCounts(
                js, await js.key_value(shape.counts_bucket), shape.counts_bucket
            ),
        )
    except BaseException as exc:
        await client.close()
        problem = refused(exc, hooks.refused)
        if problem is not None:
            raise problem from exc
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
        over at once, then drain the connection. Each step is bounded, so the whole takes
        about ``shutdown_timeout``, also when the connection is gone."""
        budget = self.config.scheduler.shutdown_timeout
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.admin.stop(), timeout=0.5)
        await self.scheduler.stop(max(0.5, budget - 1.5))
        # Closed after the scheduler, so probes see the replica until it has left.
        if self.http is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.http.close(), timeout=0.5)
        if not self.stores.client.is_closed:
            await drain_within(self.stores.client, 0.5)
        if self.telemetry is not None:
            await self.telemetry.shutdown(timeout=0.5)
        self.stopped.set()


async def _apply_config_jobs(stores: Stores, config: Config) -> None:
    """Replicas started together from one file race to write the same jobs; see
    ``apply_at_start`` for why losing that race is never fatal. A one-time job that ran and
    was deleted (``delete_after``) stays gone."""
    applied = await apply_at_start(stores.jobs, config.jobs, now_ms=int(time.time() * 1000))
    if applied.written:
        log.info("applied jobs from the config file: %s", ", ".join(applied.written))
    if applied.concurrent:
        log.info(
            "%d jobs from the config file were written by another replica meanwhile",
            len(applied.concurrent),
        )
    for warning in applied.left:
        log.warning("%s", warning)


async def start_replica(
    config: Config, env: Mapping[str, str], observer: Observer | None = None
) -> Replica:
    """Connect, provision, load and join. What an election answers (no responders, not ready,
    timeouts) is tried again from a fresh connection, for up to ``scheduler.startup_timeout``;
    a misconfiguration ends the start at once (see startup.py)."""
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
    return await start_with_retries(
        lambda: _start_once(config, env, observer, clock, telemetry),
        bound_s=config.scheduler.startup_timeout,
    )


async def _start_once(
    config: Config,
    env: Mapping[str, str],
    observer: Observer | None,
    clock: Clock,
    telemetry: Telemetry | None,
) -> Replica:
    """One attempt; whatever it fails on, it leaves no connection, listener or task behind."""
    stores = await open_stores(config)
    http: HttpServer | None = None
    pages: Console | None = None
    try:
        if config.scheduler.apply_jobs and config.jobs:
            await _apply_config_jobs(stores, config)
        if telemetry is not None:
            telemetry.track_nats(stores.client)
        scheduler = Scheduler(
            settings(config),
            members=stores.members,
            claims=stores.claims,
            triggers=stores.triggers,
            jobs=stores.jobs,
            runs=stores.runs,
            counts=stores.counts,
            marks=stores.marks,
            observer=observer or telemetry or NullObserver(),
            clock=clock,
            failpoints=Failpoints(env),
        )
        admin = AdminService(
            stores.client,
            scheduler,
            stores.jobs,
            stores.triggers,
            duplicate_window=config.scheduler.duplicate_window,
            on_refused_reply=telemetry.refused_replies.inc if telemetry is not None else None,
        )
        if telemetry is not None and config.http.listen:
            # Up before the scheduler starts, so probes see "not ready" rather than nothing.
            client = stores.client
            source = ReplicaStatus(scheduler, telemetry, connected=lambda: client.is_connected)
            pages = console(config, scheduler, source, telemetry, admin)
            http = HttpServer(
                config.http.listen,
                registry=telemetry.registry,
                source=source,
                status_token=config.http.status_token,
                mounts=[pages.mount],
            )
            try:
                await http.start()
            except OSError as exc:
                where = config.http.listen
                raise HrwcronError(f"cannot listen on http.listen {where}: {exc}") from None
        await scheduler.start()
        if telemetry is not None:
            telemetry.history_loaded()
        try:
            await admin.start()
        except BaseException:
            await scheduler.stop()
            raise
    except BaseException as exc:
        if http is not None:
            await http.close()
        if pages is not None:
            pages.close()  # the next attempt builds its own, metrics and all
        await stores.client.close()
        problem = refused(exc, stores.hooks.refused)
        if problem is not None:
            raise problem from exc
        raise
    log.info("replica %s started (instance %s)", scheduler.node, scheduler.instance)
    return Replica(config, stores, scheduler, admin=admin, telemetry=telemetry, http=http)


# How often a running replica checks that its connection is still there.
CONNECTION_CHECK_S = 0.25


async def serve(config: Config, env: Mapping[str, str]) -> int:
    """Run one replica until SIGTERM or SIGINT; returns the process exit code: 0 after a
    signal, 1 when it could not start (a misconfiguration, or JetStream not serving for
    ``startup_timeout``), hit a fatal error or lost its connection for good (a supervisor
    should restart it). A signal stops it within ``shutdown_timeout`` plus a second in every
    phase: while connecting, retrying, loading, running or after losing NATS."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    grace = config.scheduler.shutdown_timeout
    signalled = asyncio.create_task(stop.wait())
    starting = asyncio.create_task(start_replica(config, env))
    await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("stopping while starting")
        exit_deadline(grace + 1.0, 0)
        starting.cancel()
        await asyncio.wait({starting}, timeout=grace)
        if starting.done() and not starting.cancelled() and starting.exception() is None:
            await starting.result().stop()  # it finished starting meanwhile
        log.info("stopped")
        return 0
    signalled.cancel()
    try:
        replica = starting.result()
    except (NatsError, StoreUnavailable, TimeoutError) as exc:
        # What start-up does not retry because it describes the account or the cluster
        # (JetStream not enabled for the account, say).
        log.error(
            "could not start: NATS did not serve JetStream (%s: %s); is JetStream enabled "
            "and its cluster up?",
            type(exc).__name__,
            exc,
        )
        return 1
    except HrwcronError as exc:
        log.error("could not start: %s", exc)
        return 1
    code = await _run_until_stopped(replica, stop)
    exit_deadline(grace + 1.0, code or 1)  # a stop cut short is not a clean exit
    log.info("stopping")
    await replica.stop()
    log.info("stopped")
    return code


async def _run_until_stopped(replica: Replica, stop: asyncio.Event) -> int:
    """Waits for a signal (0), a fatal error (1) or a connection closed for good (1): nats-py
    does not reconnect after the server closed the connection over a protocol error."""
    client = replica.stores.client
    while not stop.is_set():
        if replica.scheduler.failed.is_set():
            return 1
        if client.is_closed:
            log.error(
                "the connection to NATS was closed for good (%s); exiting so that the "
                "supervisor restarts this replica",
                client.last_error or "no error given",
            )
            return 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CONNECTION_CHECK_S):
                await stop.wait()
    return 0


def exit_deadline(seconds: float, code: int) -> None:
    """Ends the process ``seconds`` from now if it is still running: the last resort that
    keeps a stop bounded when a library call ignores cancellation or a thread never ends."""

    def expire() -> None:
        log.error("shutdown took longer than %.1f s; exiting now", seconds)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
