"""Worker SDK: run a handler for every trigger, once per tick, and tell the scheduler while a
job is running.

``Worker`` pulls triggers from a durable JetStream consumer, continues the trace the scheduler
started (``traceparent``), runs the async handler, acks on success and naks with backoff on
failure. Two helpers make that safe:

* :class:`Processed` records each tick key in a KV bucket with compare-and-set writes, so a
  redelivered trigger (a lost ack, an ``ack_wait`` that ran out) runs the handler once;
* :class:`RunMarker` keeps ``<runs bucket>/<job>`` alive while a run of the job is in progress,
  which is what the scheduler reads to skip ticks of ``overlap = "skip"`` jobs.

The promise, and where it ends: a tick's handler runs to completion at least once, and a second
time only when the run holding the tick stopped renewing its lease before its done record
landed: its worker was killed after the handler did its work, or was paused, cut off from NATS
or had its event loop blocked for longer than about ``ack_wait`` plus the lease. Such a run is
a *takeover*: the handler sees ``trigger.takeover``, the worker logs it and counts it. Every
path that gives a trigger up is logged with the tick key and counted (:class:`WorkerStats`,
:meth:`Worker.metrics`).

Example::

    async def handle(trigger: Trigger) -> None:
        print(trigger.job, trigger.tick, trigger.message.payload)

    worker = Worker(nc, handle, durable="reports", subjects=["hrwcron.trigger.reports.>"])
    await worker.run(stop_event)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    KeyValueConfig,
    StorageType,
    StreamInfo,
)
from nats.js.errors import APIError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from hrwcron.adapters.jetstream.kv import MARKER_REASON, conditional_put
from hrwcron.adapters.jetstream.pipeline import WRONG_LAST_SEQUENCE
from hrwcron.core.errors import HrwcronError, NatsSetupError
from hrwcron.core.model import TriggerMessage
from hrwcron.engine.failpoints import Failpoints
from hrwcron.engine.ports import HEADER_MSG_ID

log = logging.getLogger("hrwcron.worker")

DEFAULT_STREAM = "HRWCRON_TRIGGERS"
DEFAULT_SUBJECTS = ("hrwcron.trigger.>",)
DEFAULT_RUNS_BUCKET = "hrwcron_runs"
DEFAULT_PROCESSED_BUCKET = "hrwcron_processed"
RUN_MARKER_TTL = 30.0  # the runs bucket's TTL, as provisioned by the replicas
DEFAULT_PROCESSED_TTL = 86_400.0  # when the trigger stream keeps messages forever
FETCH_WAIT = 1.0  # how long one pull request stays open on the server
_QUIET = 10.0  # seconds between two log lines about the same failure of one run


class WorkerSettingsError(HrwcronError, ValueError):
    """Worker arguments that cannot keep the SDK's promise; says which one and why."""


class WorkerSetupError(NatsSetupError):
    """The trigger stream or the durable consumer cannot serve this worker as configured."""


class FailpointError(HrwcronError):
    """Raised by a worker failpoint armed with ``error``: a stand-in for a failed NATS call."""


class WorkerFailpoints(Failpoints):
    """The replicas' failpoints (``HRWCRON_FAILPOINTS``, :mod:`hrwcron.engine.failpoints`) at the
    worker's steps, plus the action ``error``, which raises :class:`FailpointError` once.

    Points: ``worker_begin``, ``worker_handler_returned`` (between the handler's return and its
    done record: ``crash`` there is the one window where a tick runs twice), ``worker_finish``,
    ``worker_ack``, ``worker_beat_written`` and ``worker_marker_written`` (after a heartbeat's
    write landed, before the heartbeat goes on). Unarmed, each point costs a truth test."""

    async def hit(self, name: str, job: str) -> None:
        armed = self._armed.get(name)
        if (
            armed is not None
            and armed.action == "error"
            and not armed.fired
            and armed.job in (None, job)
        ):
            armed.fired = True
            raise FailpointError(f"failpoint {name} job={job}")
        await super().hit(name, job)


@dataclass(frozen=True)
class Trigger:
    """One delivery of a trigger to the handler."""

    message: TriggerMessage
    tick: str  # the tick key (Nats-Msg-Id): the same on every redelivery
    subject: str
    headers: Mapping[str, str]
    delivered: int  # 1 on the first delivery
    msg: Msg = field(repr=False)
    # True when this run took the tick over from a run that stopped renewing its lease (its
    # worker was killed, paused or cut off): that run may have done part or all of the work.
    takeover: bool = False

    @property
    def job(self) -> str:
        return self.message.job


Handler = Callable[[Trigger], Awaitable[None]]


def _kv_key(tick: str) -> str:
    # KV keys allow dots but not colons; tick keys are ``<job>:<due>`` or ``<job>:manual:<id>``.
    return tick.replace(":", ".")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _stale_revision(exc: Exception) -> bool:
    return isinstance(exc, KeyWrongLastSequenceError) or (
        isinstance(exc, APIError) and exc.err_code in WRONG_LAST_SEQUENCE
    )


async def _ensure_bucket(js: JetStreamContext, config: KeyValueConfig) -> StreamInfo:
    """The bucket's stream, created from ``config`` if missing. An existing bucket is used as
    it is; fewer replicas than asked for is logged, since ``hrwcron provision`` reports it."""
    stream = f"KV_{config.bucket}"
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        await js.create_key_value(config=config)
        return await js.stream_info(stream)
    have = info.config.num_replicas or 1
    if have < config.replicas:
        log.warning(
            "bucket %s has %d replica(s), fewer than the %d of the trigger stream: one NATS "
            "node down makes it unavailable; recreate it (hrwcron provision creates it right)",
            config.bucket,
            have,
            config.replicas,
        )
    return info


# --------------------------------------------------------------------------- processed ticks

RUN = "run"
DONE = "done"
BUSY = "busy"

RUNNING = "running"
FINISHED = "done"
RELEASED = "released"


class _Record(msgspec.Struct):
    state: str  # running | done | released
    owner: str  # the run that wrote it: ``<worker>/<run id>``
    at_ms: int


class Processed:
    """Tick keys a consumer has processed, one KV key each, written only by compare-and-set.

    ``begin`` claims ``<consumer>.<tick>`` as *running* (create-only; a delete or purge marker
    left by an operator counts as absent, a *released* record is taken back), ``extend`` renews
    it while the handler runs, ``finish`` turns it into *done*, ``release`` (after a failure)
    gives the tick back so the next delivery retries. A *running* record another run holds is
    left alone while its revision keeps changing; one that stayed at the same revision for
    ``lease`` seconds, as the caller observed on its own clock, may be taken over with
    ``take_over``. Records live ``ttl`` seconds (per-key TTL; the bucket's max age too).

    Every write names the revision it replaces, so a write that timed out and lands later
    cannot undo a newer one; a run that finds its own newer record (its earlier write landed
    after all) goes on from there."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        *,
        namespace: str,
        ttl: float = DEFAULT_PROCESSED_TTL,
        lease: float = 30.0,
    ) -> None:
        self._js = js
        self.bucket = bucket
        self.namespace = namespace
        self.ttl = ttl
        self.lease = lease

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        *,
        namespace: str,
        bucket: str = DEFAULT_PROCESSED_BUCKET,
        ttl: float = DEFAULT_PROCESSED_TTL,
        lease: float = 30.0,
        replicas: int = 1,
        storage: StorageType = StorageType.FILE,
        max_bytes: int | None = None,
    ) -> Processed:
        """Bind to ``bucket``, creating it if missing: history 1, per-key TTL allowed, max age
        ``ttl``, ``replicas``, ``storage``, and ``max_bytes`` if given (a full bucket refuses
        new records: the worker then holds its triggers and logs, it does not run them)."""
        info = await _ensure_bucket(
            js,
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=ttl,
                storage=storage,
                replicas=replicas,
                max_bytes=max_bytes,
            ),
        )
        if not info.config.allow_msg_ttl:
            raise WorkerSetupError(
                f"bucket {bucket} does not allow per-message TTL (allow_msg_ttl); delete it "
                "so the worker recreates it, or name another bucket"
            )
        return cls(js, bucket, namespace=namespace, ttl=ttl, lease=lease)

    def key(self, tick: str) -> str:
        return f"{self.namespace}.{_kv_key(tick)}"

    async def _write(self, tick: str, state: str, owner: str, last: int) -> int | None:
        record = msgspec.json.encode(_Record(state, owner, _now_ms()))
        return await conditional_put(self._js, self.bucket, self.key(tick), record, last, self.ttl)

    async def read(self, tick: str) -> tuple[_Record | None, int]:
        """The tick's record (None: absent, deleted or purged) and the key's last revision,
        which for a delete or purge marker is the marker's own (0 when the key has none)."""
        try:
            msg = await self._js.get_last_msg(
                f"KV_{self.bucket}", f"$KV.{self.bucket}.{self.key(tick)}"
            )
        except NotFoundError:
            return None, 0
        last = int(msg.seq or 0)
        headers = msg.headers or {}
        if headers.get(KV_OP) in (KV_DEL, KV_PURGE) or MARKER_REASON in headers:
            return None, last
        try:
            return msgspec.json.decode(msg.data or b"", type=_Record), last
        except msgspec.MsgspecError:
            return _Record(RELEASED, "", 0), last  # unreadable: anyone may claim it, by CAS

    async def begin(self, tick: str, owner: str) -> tuple[str, int]:
        """``(RUN, revision)`` when ``owner`` should run the tick, ``(DONE, revision)`` when it
        was processed already, ``(BUSY, revision)`` while another run holds it."""
        for _ in range(5):
            revision = await self._write(tick, RUNNING, owner, 0)
            if revision is not None:
                return RUN, revision
            record, last = await self.read(tick)
            if record is None:
                if not last:
                    continue  # expired between the write and the read
                # An operator deleted or purged the record to have the tick run again.
                revision = await self._write(tick, RUNNING, owner, last)
            elif record.state == FINISHED:
                return DONE, last
            elif record.state == RUNNING:
                # Our own earlier attempt, whose reply was lost, or somebody else's run.
                return (RUN if record.owner == owner else BUSY), last
            else:  # released by a run that failed or was stopped
                revision = await self._write(tick, RUNNING, owner, last)
            if revision is not None:
                return RUN, revision
        raise HrwcronError(f"the processed record of {tick} kept changing; try again")

    async def take_over(self, tick: str, owner: str, revision: int) -> int | None:
        """Claim a *running* record still at ``revision``; None if it changed meanwhile."""
        return await self._write(tick, RUNNING, owner, revision)

    async def _rewrite(self, tick: str, state: str, owner: str, revision: int) -> int | None:
        written = await self._write(tick, state, owner, revision)
        if written is not None:
            return written
        record, last = await self.read(tick)
        if record is None or record.owner != owner:
            return None  # another run holds the tick now
        if record.state == state and state != RUNNING:
            return last  # an earlier attempt of this very write landed after its timeout
        if record.state != RUNNING:
            return None
        return await self._write(tick, state, owner, last)

    async def extend(self, tick: str, owner: str, revision: int) -> int | None:
        """Renew the running record; None if another run holds it now."""
        return await self._rewrite(tick, RUNNING, owner, revision)

    async def finish(self, tick: str, owner: str, revision: int) -> bool:
        return await self._rewrite(tick, FINISHED, owner, revision) is not None

    async def release(self, tick: str, owner: str, revision: int) -> bool:
        return await self._rewrite(tick, RELEASED, owner, revision) is not None

    async def state(self, tick: str) -> str | None:
        record, _ = await self.read(tick)
        return None if record is None else record.state


# --------------------------------------------------------------------------- run markers


class _RunEntry(msgspec.Struct):
    worker: str
    tick: str
    started_ms: int
    beat_ms: int


class _Marker(msgspec.Struct):
    # The newest run, for readers that show one; ``runs`` holds every run in progress.
    worker: str
    tick: str
    started_ms: int
    beat_ms: int
    runs: dict[str, _RunEntry] = msgspec.field(default_factory=dict)


class RunMarker:
    """``<runs bucket>/<job>`` while any run of ``job`` is in progress, on any worker.

    The marker lists every run by its id; a run adds itself, renews its entry each heartbeat
    and removes only itself, deleting the key when it was the last one. Writes are
    compare-and-set, so two workers never drop each other's entries. Entries not renewed for
    the marker TTL belong to dead runs and are dropped by the next write; the bucket's TTL
    removes the key when every run holding it died."""

    def __init__(
        self, js: JetStreamContext, kv: KeyValue, bucket: str, worker: str, ttl: float
    ) -> None:
        self._js = js
        self._kv = kv
        self.bucket = bucket
        self.worker = worker
        self.ttl = ttl
        self._known: dict[str, tuple[_Marker | None, int]] = {}

    @classmethod
    async def open(
        cls, js: JetStreamContext, worker: str, bucket: str, *, replicas: int = 1
    ) -> RunMarker:
        # The same shape the replicas provision, so whoever comes first makes it.
        info = await _ensure_bucket(
            js,
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=RUN_MARKER_TTL,
                storage=StorageType.MEMORY,
                replicas=replicas,
            ),
        )
        kv = await js.key_value(bucket)
        return cls(js, kv, bucket, worker, info.config.max_age or RUN_MARKER_TTL)

    async def _read(self, job: str) -> tuple[_Marker | None, int]:
        try:
            msg = await self._js.get_last_msg(f"KV_{self.bucket}", f"$KV.{self.bucket}.{job}")
        except NotFoundError:
            return None, 0
        last = int(msg.seq or 0)
        headers = msg.headers or {}
        if headers.get(KV_OP) in (KV_DEL, KV_PURGE) or MARKER_REASON in headers:
            return None, last
        try:
            return msgspec.json.decode(msg.data or b"", type=_Marker), last
        except msgspec.MsgspecError:
            return None, last  # not ours to understand: replaced by the next write

    async def _update(self, job: str, change: Callable[[dict[str, _RunEntry]], bool]) -> None:
        """Apply ``change`` (True when it changed something) to the job's runs and write the
        result by compare-and-set: from the last marker this worker wrote, re-read after a
        conflict (another run's write, or the marker's expiry)."""
        for attempt in range(8):
            if attempt or job not in self._known:
                self._known[job] = await self._read(job)
            current, last = self._known[job]
            runs = dict(current.runs) if current is not None else {}
            changed = change(runs)
            horizon = _now_ms() - self.ttl * 1000
            alive = {run: entry for run, entry in runs.items() if entry.beat_ms >= horizon}
            if not changed and len(alive) == len(runs):
                return
            if alive:
                newest = max(alive.values(), key=lambda entry: entry.started_ms)
                marker = _Marker(
                    newest.worker, newest.tick, newest.started_ms, newest.beat_ms, alive
                )
                written = await conditional_put(
                    self._js, self.bucket, job, msgspec.json.encode(marker), last, None
                )
                if written is not None:
                    self._known[job] = (marker, written)
                    return
            elif current is None:
                return  # nothing left and nothing stored
            else:
                try:
                    await self._kv.delete(job, last=last)
                except APIError as exc:
                    if not _stale_revision(exc):
                        raise
                else:
                    self._known.pop(job, None)
                    return
        raise HrwcronError(f"the run marker of {job} kept changing; try again")

    async def mark(self, job: str, run: str, tick: str, started_ms: int) -> None:
        """Add or renew ``run``'s entry in the marker of ``job``."""
        entry = _RunEntry(self.worker, tick, started_ms, _now_ms())

        def add(runs: dict[str, _RunEntry]) -> bool:
            runs[run] = entry
            return True

        await self._update(job, add)

    async def clear(self, job: str, run: str) -> None:
        """Remove ``run``'s entry; delete the marker if no other run of ``job`` is left."""

        def remove(runs: dict[str, _RunEntry]) -> bool:
            return runs.pop(run, None) is not None

        await self._update(job, remove)
        self._known.pop(job, None)


# --------------------------------------------------------------------------- the worker


@dataclass
class WorkerStats:
    """What happened to the deliveries this worker took; exported by :meth:`Worker.metrics`."""

    handled: int = 0  # the handler returned
    failed: int = 0  # the handler raised: nak with backoff, or term on the last delivery
    duplicates: int = 0  # deliveries of a tick already done: acked without running
    busy: int = 0  # deliveries that found another run of their tick in progress and waited
    poison: int = 0  # bodies that are not triggers: terminated
    given_up: int = 0  # triggers this worker gave up for good (each logged with its tick)
    takeovers: int = 0  # runs over a lapsed lease: the tick's handler may run a second time
    lease_lost: int = 0  # runs whose record another worker took over while they ran
    interrupted: int = 0  # runs cancelled by stop(): released and handed back
    loop_stalls: int = 0  # heartbeats late by more than a heartbeat: the event loop was blocked
    errors: int = 0  # failed NATS calls (record, marker, ack, nak, term), each logged


class WorkerMetrics(Collector):
    """``hrwcron_worker_events_total{durable, event}``: :class:`WorkerStats` at scrape time."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "hrwcron_worker_events",
            "Deliveries and faults of an hrwcron worker by event (see WorkerStats).",
            labels=["durable", "event"],
        )
        for name, value in dataclasses.asdict(self._worker.stats).items():
            family.add_metric([self._worker.durable, name], value)
        yield family


@dataclass
class _Run:
    """One delivery of a trigger, from its claim to its ack."""

    msg: Msg
    message: TriggerMessage
    tick: str
    headers: dict[str, str]
    delivered: int
    owner: str  # ``<worker>/<run id>`` in the processed record and the run marker
    revision: int = 0  # of the processed record this run holds; 0: none
    takeover: bool = False
    lost: bool = False  # another run took the processed record over
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    quiet_until: dict[str, float] = field(default_factory=dict)

    @property
    def job(self) -> str:
        return self.message.job


class Worker:
    """Runs ``handler`` for triggers on ``subjects`` from the durable pull consumer
    ``durable`` (created if missing; an existing one is checked, and its ``ack_wait`` and
    ``max_deliver`` are the ones used)."""

    def __init__(
        self,
        client: Client,
        handler: Handler,
        *,
        durable: str,
        subjects: Sequence[str] | str = DEFAULT_SUBJECTS,
        stream: str = DEFAULT_STREAM,
        concurrency: int = 4,
        ack_wait: float = 30.0,
        max_deliver: int = 5,
        backoff: Sequence[float] = (1.0, 5.0, 30.0),
        heartbeat: float = 10.0,
        deliver_new: bool = True,
        idempotent: bool = True,
        processed_bucket: str = DEFAULT_PROCESSED_BUCKET,
        processed_ttl: float | None = None,
        processed_max_bytes: int | None = None,
        processed_storage: Literal["file", "memory"] | None = None,
        bucket_replicas: int | None = None,
        run_markers: bool = True,
        runs_bucket: str = DEFAULT_RUNS_BUCKET,
        name: str | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        if concurrency < 1:
            raise WorkerSettingsError("concurrency must be at least 1")
        if not backoff or any(b <= 0 for b in backoff):
            raise WorkerSettingsError("backoff needs at least one positive delay")
        if not 0 < heartbeat <= min(ack_wait, RUN_MARKER_TTL) / 2:
            raise WorkerSettingsError(
                f"heartbeat ({heartbeat:g} s) must be above 0 and at most half of ack_wait "
                f"({ack_wait:g} s) and of the run marker TTL ({RUN_MARKER_TTL:g} s), so a late "
                "heartbeat still lands before the trigger is redelivered"
            )
        if max_deliver != -1 and max_deliver < 1:
            raise WorkerSettingsError(
                f"max_deliver ({max_deliver}) must be at least 1, or -1 for unlimited"
            )
        if bucket_replicas is not None and not 1 <= bucket_replicas <= 5:
            raise WorkerSettingsError(
                f"bucket_replicas ({bucket_replicas}) must be between 1 and 5"
            )
        if processed_storage not in (None, "file", "memory"):
            raise WorkerSettingsError(
                f"processed_storage ({processed_storage!r}) must be 'file' or 'memory'"
            )
        if processed_ttl is not None and processed_ttl <= 0:
            raise WorkerSettingsError(f"processed_ttl ({processed_ttl:g} s) must be above 0")
        if processed_max_bytes is not None and processed_max_bytes <= 0:
            raise WorkerSettingsError(
                f"processed_max_bytes ({processed_max_bytes}) must be above 0"
            )
        self.client = client
        self.handler = handler
        self.durable = durable
        self.subjects = [subjects] if isinstance(subjects, str) else list(subjects)
        self.stream = stream
        self.concurrency = concurrency
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.backoff = list(backoff)
        self.heartbeat = heartbeat
        self.deliver_new = deliver_new
        self.idempotent = idempotent
        self.processed_bucket = processed_bucket
        self.processed_ttl = processed_ttl
        self.processed_max_bytes = processed_max_bytes
        self.processed_storage = processed_storage
        self.bucket_replicas = bucket_replicas
        self.run_markers = run_markers
        self.runs_bucket = runs_bucket
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.tracer = tracer or trace.get_tracer("hrwcron.worker")
        self.stats = WorkerStats()
        self.processed: Processed | None = None
        self.markers: RunMarker | None = None
        self._js = client.jetstream()
        self._subscription: Any = None
        self._loop: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._faults = WorkerFailpoints(os.environ)

    @property
    def lease(self) -> float:
        """How long a running record may stay unrenewed before another delivery of its tick
        takes it over: ``ack_wait`` (the consumer's), at least three heartbeats."""
        return max(self.ack_wait, 3 * self.heartbeat)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def metrics(self) -> WorkerMetrics:
        """A Prometheus collector of this worker's :class:`WorkerStats`; register it with
        ``registry.register(worker.metrics())``."""
        return WorkerMetrics(self)

    # ------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Check the stream and the consumer, open the buckets, start pulling. Raises
        :class:`WorkerSetupError` for a stream or consumer that cannot keep the promise."""
        stream = await self._stream_info()
        self._adopt(await self._ensure_consumer())
        replicas = self.bucket_replicas or stream.config.num_replicas or 1
        if self.idempotent:
            # The stream's own storage unless told otherwise (nats-py reads it back as a str).
            storage = StorageType(self.processed_storage or stream.config.storage or "file")
            self.processed = await Processed.open(
                self._js,
                namespace=self.durable,
                bucket=self.processed_bucket,
                ttl=self.processed_ttl or stream.config.max_age or DEFAULT_PROCESSED_TTL,
                lease=self.lease,
                replicas=replicas,
                storage=storage,
                max_bytes=self.processed_max_bytes,
            )
        if self.run_markers:
            self.markers = await RunMarker.open(
                self._js, self.name, self.runs_bucket, replicas=replicas
            )
        self._subscription = await self._js.pull_subscribe_bind(
            durable=self.durable, stream=self.stream
        )
        self._loop = asyncio.create_task(self._fetch_loop(), name=f"worker-{self.durable}")

    async def _stream_info(self) -> StreamInfo:
        try:
            return await self._js.stream_info(self.stream)
        except NotFoundError:
            raise WorkerSetupError(
                f"stream {self.stream} does not exist: start an hrwcron replica or run "
                "`hrwcron provision` first"
            ) from None

    async def _ensure_consumer(self) -> ConsumerInfo:
        try:
            existing: ConsumerInfo = await self._js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            pass
        else:
            return existing
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            max_ack_pending=max(1000, 4 * self.concurrency),
            deliver_policy=DeliverPolicy.NEW if self.deliver_new else DeliverPolicy.ALL,
            description="hrwcron worker",
        )
        if len(self.subjects) == 1:
            config.filter_subject = self.subjects[0]
        else:
            config.filter_subjects = self.subjects
        created: ConsumerInfo = await self._js.add_consumer(self.stream, config=config)
        return created

    def _adopt(self, info: ConsumerInfo) -> None:
        """Refuse a consumer this worker cannot serve safely; take its ``ack_wait`` and
        ``max_deliver``, since those are what the server applies."""
        config = info.config
        problems: list[str] = []
        if config.deliver_subject:
            problems.append("is a push consumer; the worker pulls, so give it another durable")
        if config.ack_policy not in (None, AckPolicy.EXPLICIT):
            problems.append(f"acks {config.ack_policy}; the worker needs explicit acks")
        ack_wait = config.ack_wait or 30.0  # the server's default
        if self.heartbeat > ack_wait / 2:
            problems.append(
                f"has ack_wait {ack_wait:g} s, too short for heartbeat {self.heartbeat:g} s: a "
                "running trigger would be redelivered and run again. Pass heartbeat <= "
                f"{ack_wait / 2:g}, or delete the consumer so the worker recreates it"
            )
        short = [b for b in config.backoff or [] if b < 2 * self.heartbeat]
        if short:
            problems.append(
                f"has redelivery backoff {config.backoff} with steps shorter than twice the "
                f"heartbeat ({self.heartbeat:g} s): a running trigger would be redelivered"
            )
        if problems:
            where = f"consumer {self.durable} on stream {self.stream}"
            raise WorkerSetupError(f"{where} {'; '.join(problems)}")
        wanted = set(self.subjects)
        filtered = set(config.filter_subjects or []) | (
            {config.filter_subject} if config.filter_subject else set()
        )
        if filtered and filtered != wanted:
            log.warning(
                "consumer %s filters %s, not the subjects this worker was given (%s); it "
                "delivers what it filters",
                self.durable,
                sorted(filtered),
                sorted(wanted),
            )
        max_deliver = config.max_deliver if config.max_deliver and config.max_deliver > 0 else -1
        if (ack_wait, max_deliver) != (self.ack_wait, self.max_deliver):
            log.info(
                "consumer %s exists with ack_wait %g s and max_deliver %d; using those",
                self.durable,
                ack_wait,
                max_deliver,
            )
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling, let running handlers finish (bounded by ``timeout``), then cancel
        the rest (each released and handed back) and unsubscribe. A trigger that arrives on
        the last open pull request is handled like the others, not left to wait out
        ``ack_wait``."""
        self._stopping.set()
        if self._loop is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._loop), FETCH_WAIT + 5)
            except TimeoutError:
                self._loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout)
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    async def _fetch_loop(self) -> None:
        # Never cancelled in the middle of a pull: a pull request the server still holds
        # would take a trigger nobody reads, and that trigger would wait out ack_wait.
        while not self._stopping.is_set():
            free = self.concurrency - len(self._inflight)
            if free <= 0:
                await self._wait_any(set(self._inflight))
                continue
            try:
                messages = await self._subscription.fetch(batch=free, timeout=FETCH_WAIT)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:
                log.warning("fetch from %s failed: %s", self.durable, _describe(exc))
                await self._pause(1.0)
                continue
            for msg in messages:
                task = asyncio.create_task(self.handle(msg))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    async def _wait_any(self, tasks: set[asyncio.Task[None]]) -> None:
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({*tasks, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``; True, early, when the worker starts stopping."""
        return await _wait(self._stopping, seconds)

    # ------------------------------------------------------------------------ one trigger

    def _delay(self, delivered: int) -> float:
        return self.backoff[min(max(delivered, 1), len(self.backoff)) - 1]

    async def handle(self, msg: Msg) -> None:
        """Process one delivery: decode, claim the tick, run, ack or nak. Does not raise:
        every failure is logged with the tick key and counted."""
        try:
            await self._handle(msg)
        except Exception:
            self.stats.errors += 1
            log.exception("delivery on %s failed unexpectedly", msg.subject)

    async def _handle(self, msg: Msg) -> None:
        headers = dict(msg.headers or {})
        delivered = int(msg.metadata.num_delivered or 1)
        try:
            message = msgspec.json.decode(msg.data, type=TriggerMessage)
        except msgspec.MsgspecError as exc:
            log.error("%s: not a trigger (%s); terminated", msg.subject, exc)
            self.stats.poison += 1
            with contextlib.suppress(Exception):
                await msg.term()
            return
        tick = headers.get(HEADER_MSG_ID) or message.tick
        run = _Run(msg, message, tick, headers, delivered, f"{self.name}/{uuid.uuid4().hex[:8]}")
        parent = propagate.extract(headers)
        remote = trace.get_current_span(parent).get_span_context()
        links = [Link(remote)] if remote.is_valid else []
        attributes: dict[str, str | int | bool] = {
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.destination.name": msg.subject,
            "messaging.message.id": tick,
            "messaging.consumer.group.name": self.durable,
            "hrwcron.job": message.job,
            "hrwcron.tick": tick,
            "hrwcron.kind": message.kind,
            "hrwcron.delivered": delivered,
        }
        with self.tracer.start_as_current_span(
            f"hrwcron.worker {message.job}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        ) as span:
            if self.processed is not None and not await self._claim(run, self.processed, span):
                return
            span.set_attribute("hrwcron.takeover", run.takeover)
            await self._run(run, span)

    async def _claim(self, run: _Run, processed: Processed, span: trace.Span) -> bool:
        """True when this delivery is to run the handler. While another run holds the tick,
        or while the record cannot be read or written, the delivery is held (in-progress
        acks, which do not count against max_deliver) and the claim retried each heartbeat."""
        loop = asyncio.get_running_loop()
        watched, since = 0, 0.0  # the other run's revision, and when it was first seen
        waiting = False
        while True:
            try:
                if self._faults:
                    await self._faults.hit("worker_begin", run.job)
                state, revision = await processed.begin(run.tick, run.owner)
            except Exception as exc:
                self._error(run, "cannot read or write its processed record", exc, "retrying")
            else:
                if state == RUN:
                    run.revision = revision
                    return True
                if state == DONE:
                    span.set_attribute("hrwcron.duplicate", True)
                    self.stats.duplicates += 1
                    await self._ack(run)
                    return False
                if not waiting:
                    waiting = True
                    self.stats.busy += 1
                    span.set_attribute("hrwcron.busy", True)
                now = loop.time()
                if revision != watched:
                    watched, since = revision, now
                elif now - since >= processed.lease and await self._take_over(run, revision):
                    return True
            if self._stopping.is_set():
                await self._give_back(run, "the worker is stopping")
                return False
            await self._keep(run)
            await self._pause(self.heartbeat)

    async def _take_over(self, run: _Run, revision: int) -> bool:
        assert self.processed is not None
        try:
            taken = await self.processed.take_over(run.tick, run.owner, revision)
        except Exception as exc:
            self._error(run, "cannot take over its processed record", exc, "retrying")
            return False
        if taken is None:
            return False
        run.revision, run.takeover = taken, True
        self.stats.takeovers += 1
        log.warning(
            "%s: taking over from a run that renewed nothing for %g s (its worker was killed, "
            "paused or cut off from NATS); if that run had reached or passed its handler, the "
            "handler runs a second time",
            run.tick,
            self.lease,
        )
        return True

    async def _run(self, run: _Run, span: trace.Span) -> None:
        trigger = Trigger(
            run.message,
            run.tick,
            run.msg.subject,
            run.headers,
            run.delivered,
            run.msg,
            takeover=run.takeover,
        )
        started = _now_ms()
        await self._mark(run, started)
        loop = asyncio.get_running_loop()
        # The first beat is due a heartbeat from now, not from whenever the beat task first
        # runs: a handler that blocks the loop straight away must show up as a late beat.
        beat = asyncio.create_task(self._beat(run, started, loop.time() + self.heartbeat))
        try:
            try:
                await self.handler(trigger)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    await self._interrupted(run, beat)
                    raise
                await self._failed(run, beat, span, exc)  # the handler raised it itself
                return
            except Exception as exc:
                await self._failed(run, beat, span, exc)
                return
            if self._faults:
                await self._faults.hit("worker_handler_returned", run.job)
            await self._stop_beat(run, beat)
            await self._succeeded(run)
        finally:
            run.stop.set()  # whatever happened above, no heartbeat outlives the run

    async def _succeeded(self, run: _Run) -> None:
        # The window in which a kill -9 makes the tick run again ends when the done record
        # lands: it is written first, before the ack and the marker.
        recorded = await self._record_done(run)
        acked = await self._ack(run)
        if not (recorded or acked):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.lease
            while not (recorded or acked) and loop.time() < deadline:
                await self._keep(run)
                await asyncio.sleep(min(1.0, self.heartbeat))
                recorded = await self._record_done(run)
                acked = await self._ack(run)
            if not (recorded or acked):
                log.error(
                    "%s: the handler returned, but neither its done record nor its ack "
                    "landed: once the lease lapses another worker runs it again (counted "
                    "there as a takeover)",
                    run.tick,
                )
        await self._clear(run)
        self.stats.handled += 1

    async def _failed(
        self, run: _Run, beat: asyncio.Task[None], span: trace.Span, exc: BaseException
    ) -> None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        self.stats.failed += 1
        await self._stop_beat(run, beat)
        await self._release(run)
        await self._clear(run)
        if self._last_delivery(run):
            self.stats.given_up += 1
            log.error(
                "%s failed on delivery %d of %d, giving up: %s",
                run.tick,
                run.delivered,
                self.max_deliver,
                _describe(exc),
            )
            try:
                await run.msg.term()
            except Exception as term_exc:
                self._error(run, "term failed", term_exc)
            return
        delay = self._delay(run.delivered)
        log.warning(
            "%s failed on delivery %d (%s); retry in %g s",
            run.tick,
            run.delivered,
            _describe(exc),
            delay,
        )
        await self._nak(run, delay)

    async def _interrupted(self, run: _Run, beat: asyncio.Task[None]) -> None:
        self.stats.interrupted += 1
        await self._stop_beat(run, beat)
        await self._release(run)
        await self._clear(run)
        await self._give_back(run, "its handler was cancelled by stop()")

    def _last_delivery(self, run: _Run) -> bool:
        return 0 < self.max_deliver <= run.delivered

    async def _give_back(self, run: _Run, why: str) -> None:
        """Nak the delivery for another worker; on the last delivery that drops the trigger
        for good, so it is logged and counted as given up."""
        if self._last_delivery(run):
            self.stats.given_up += 1
            log.error(
                "%s: %s on delivery %d of %d, giving up: JetStream will not deliver it again",
                run.tick,
                why,
                run.delivered,
                self.max_deliver,
            )
        else:
            log.warning("%s: %s; handed back for redelivery", run.tick, why)
        await self._nak(run, 0.0)

    # ------------------------------------------------------------------------ NATS calls

    def _error(self, run: _Run, what: str, exc: BaseException, then: str = "") -> None:
        """Count a failed NATS call and log it with the tick key (the same failure of the
        same run at most every few seconds, so an outage does not flood the log)."""
        self.stats.errors += 1
        now = time.monotonic()
        if run.quiet_until.get(what, 0.0) > now:
            return
        run.quiet_until[what] = now + _QUIET
        log.warning("%s: %s: %s%s", run.tick, what, _describe(exc), f"; {then}" if then else "")

    async def _keep(self, run: _Run) -> None:
        try:
            await run.msg.in_progress()
        except Exception as exc:
            self._error(run, "in-progress ack failed", exc)

    async def _ack(self, run: _Run) -> bool:
        try:
            if self._faults:
                await self._faults.hit("worker_ack", run.job)
            await run.msg.ack_sync()
        except Exception as exc:
            self._error(
                run,
                "ack failed",
                exc,
                "a redelivery finds the done record and is acked without running",
            )
            return False
        return True

    async def _nak(self, run: _Run, delay: float) -> None:
        try:
            await run.msg.nak(delay=delay or None)
        except Exception as exc:
            self._error(run, "nak failed", exc, "redelivered once ack_wait lapses")

    async def _record_done(self, run: _Run) -> bool:
        if self.processed is None or not run.revision or run.lost:
            return True  # nothing of this run's to record
        try:
            if self._faults:
                await self._faults.hit("worker_finish", run.job)
            finished = await self.processed.finish(run.tick, run.owner, run.revision)
        except Exception as exc:
            self._error(
                run,
                "cannot write its done record",
                exc,
                "acking anyway, so JetStream does not deliver it again",
            )
            return False
        if not finished:
            self._lost(run)
        return True

    async def _release(self, run: _Run) -> None:
        if self.processed is None or not run.revision or run.lost:
            return
        try:
            released = await self.processed.release(run.tick, run.owner, run.revision)
        except Exception as exc:
            self._error(
                run,
                "cannot release its processed record",
                exc,
                "the retry waits out the lease and takes it over",
            )
            return
        if not released:
            self._lost(run)

    def _lost(self, run: _Run) -> None:
        if run.lost:
            return
        run.lost = True
        self.stats.lease_lost += 1
        log.warning(
            "%s: another worker took this run's record over (this worker renewed nothing for "
            "longer than the lease: paused, cut off from NATS or its event loop blocked); the "
            "handler runs there too",
            run.tick,
        )

    async def _mark(self, run: _Run, started: int) -> None:
        if self.markers is None:
            return
        try:
            await self.markers.mark(run.job, run.owner, run.tick, started)
        except Exception as exc:
            self._error(
                run,
                "cannot write its run marker",
                exc,
                'running anyway; an overlap = "skip" job is not skipped meanwhile',
            )

    async def _clear(self, run: _Run) -> None:
        if self.markers is None:
            return
        try:
            await self.markers.clear(run.job, run.owner)
        except Exception as exc:
            self._error(
                run, "cannot clear its run marker", exc, f"it expires within {RUN_MARKER_TTL:g} s"
            )

    # ------------------------------------------------------------------------ heartbeat

    async def _stop_beat(self, run: _Run, beat: asyncio.Task[None]) -> None:
        """Let the heartbeat finish the write it is in, then end it. Cancelling it there
        would lose the revision that write produced (and a later write would then fail)."""
        run.stop.set()
        await asyncio.shield(beat)

    async def _beat(self, run: _Run, started: int, due: float) -> None:
        """While the handler runs: keep the delivery, the processed record and the run
        marker alive, and notice when the event loop was blocked."""
        loop = asyncio.get_running_loop()
        while True:
            stopped = await _wait(run.stop, due - loop.time())
            late = loop.time() - due
            if late > self.heartbeat:
                # Also seen at the end of a handler that never yielded: no beat ran at all.
                self.stats.loop_stalls += 1
                log.warning(
                    "%s: a heartbeat came %.1f s late: the event loop was blocked (a handler "
                    "or callback that does not await); past ack_wait (%g s) the trigger is "
                    "redelivered and, past the lease, run a second time",
                    run.tick,
                    late,
                    self.ack_wait,
                )
            if stopped:
                return
            await self._beat_once(run, started)
            due = loop.time() + self.heartbeat  # after the writes: a slow reply is no stall

    async def _beat_once(self, run: _Run, started: int) -> None:
        await self._keep(run)
        if self.processed is not None and run.revision and not run.lost:
            try:
                renewed = await self.processed.extend(run.tick, run.owner, run.revision)
            except Exception as exc:
                self._error(run, "cannot renew its processed record", exc)
            else:
                if self._faults:
                    await self._faults.hit("worker_beat_written", run.job)
                if renewed is None:
                    self._lost(run)
                else:
                    run.revision = renewed
        if self.markers is not None:
            await self._mark(run, started)
            if self._faults:
                await self._faults.hit("worker_marker_written", run.job)


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``; True if it is set."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, seconds))
    return event.is_set()
