"""Worker SDK: run a handler for every trigger, once per tick, and tell the scheduler while a
job is running.

``Worker`` pulls triggers from a durable JetStream consumer, continues the trace the scheduler
started (``traceparent``), runs the async handler, acks on success and naks with backoff on
failure. Two helpers make that safe:

* :class:`Processed` records each tick key in a KV bucket with create-only semantics, so a
  redelivered trigger (a lost ack, an ``ack_wait`` that ran out) runs the handler once;
* :class:`RunMarker` keeps ``<runs bucket>/<job>`` alive while the handler runs, which is what
  the scheduler reads to skip ticks of ``overlap = "skip"`` jobs.

Example::

    async def handle(trigger: Trigger) -> None:
        print(trigger.job, trigger.tick, trigger.message.payload)

    worker = Worker(nc, handle, durable="reports", subjects=["hrwcron.trigger.reports.>"])
    await worker.run(stop_event)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    StorageType,
)
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from .errors import HrwcronError
from .jetstream.kv import conditional_put
from .model import TriggerMessage
from .ports import HEADER_MSG_ID

log = logging.getLogger("hrwcron.worker")

DEFAULT_STREAM = "HRWCRON_TRIGGERS"
DEFAULT_SUBJECTS = ("hrwcron.trigger.>",)
DEFAULT_RUNS_BUCKET = "hrwcron_runs"
DEFAULT_PROCESSED_BUCKET = "hrwcron_processed"
RUN_MARKER_TTL = 30.0  # the runs bucket's TTL, as provisioned by the replicas


@dataclass(frozen=True)
class Trigger:
    """One delivery of a trigger to the handler."""

    message: TriggerMessage
    tick: str  # the tick key (Nats-Msg-Id): the same on every redelivery
    subject: str
    headers: Mapping[str, str]
    delivered: int  # 1 on the first delivery
    msg: Msg = field(repr=False)

    @property
    def job(self) -> str:
        return self.message.job


Handler = Callable[[Trigger], Awaitable[None]]


def _kv_key(tick: str) -> str:
    # KV keys allow dots but not colons; tick keys are ``<job>:<due>`` or ``<job>:manual:<id>``.
    return tick.replace(":", ".")


class _Record(msgspec.Struct):
    state: str  # running | done | released
    owner: str
    at_ms: int


RUN = "run"
DONE = "done"
BUSY = "busy"


class Processed:
    """Tick keys a consumer has processed, one KV key each, with per-key TTLs.

    ``begin`` creates ``<consumer>.<tick>`` as *running* with a short lease (create-only: of
    two deliveries only one wins); ``finish`` turns it into *done* for ``ttl``; ``release``
    (after a failure) gives the tick back so the next delivery retries. A worker that dies
    mid-run leaves a *running* key that expires after ``lease``; it is then retried."""

    def __init__(
        self,
        js: JetStreamContext,
        kv: KeyValue,
        bucket: str,
        *,
        namespace: str,
        ttl: float = 86_400.0,
        lease: float = 30.0,
    ) -> None:
        self._js = js
        self._kv = kv
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
        ttl: float = 86_400.0,
        lease: float = 30.0,
        replicas: int = 1,
    ) -> Processed:
        """Bind to ``bucket``, creating it (file storage, per-key TTL allowed) if missing."""
        try:
            info = await js.stream_info(f"KV_{bucket}")
        except NotFoundError:
            await js.create_key_value(
                config=KeyValueConfig(
                    bucket=bucket, history=1, storage=StorageType.FILE, replicas=replicas
                )
            )
        else:
            if not info.config.allow_msg_ttl:
                raise HrwcronError(
                    f"bucket {bucket} does not allow per-message TTL (allow_msg_ttl); delete it "
                    "so the worker recreates it, or name another bucket"
                )
        kv = await js.key_value(bucket)
        return cls(js, kv, bucket, namespace=namespace, ttl=ttl, lease=lease)

    def key(self, tick: str) -> str:
        return f"{self.namespace}.{_kv_key(tick)}"

    async def _put(self, tick: str, state: str, owner: str, last: int, ttl: float) -> int | None:
        record = msgspec.json.encode(_Record(state, owner, int(time.time() * 1000)))
        return await conditional_put(self._js, self.bucket, self.key(tick), record, last, ttl)

    async def begin(self, tick: str, owner: str) -> tuple[str, int]:
        """``(RUN, revision)`` when this caller should run the tick, ``(DONE, 0)`` when it was
        processed already, ``(BUSY, 0)`` while another delivery is running it."""
        for _ in range(3):
            revision = await self._put(tick, "running", owner, 0, self.lease)
            if revision is not None:
                return RUN, revision
            try:
                entry = await self._kv.get(self.key(tick))
            except KeyNotFoundError:
                continue  # expired between the create and the read
            try:
                held = msgspec.json.decode(entry.value or b"", type=_Record)
            except msgspec.MsgspecError:
                held = _Record("released", "", 0)
            if held.state == "done":
                return DONE, 0
            if held.state == "running":
                return BUSY, 0
            revision = await self._put(tick, "running", owner, int(entry.revision or 0), self.lease)
            if revision is not None:
                return RUN, revision
        return BUSY, 0

    async def extend(self, tick: str, owner: str, revision: int) -> int | None:
        """Renew the running lease; None if the key is no longer ours."""
        return await self._put(tick, "running", owner, revision, self.lease)

    async def finish(self, tick: str, owner: str, revision: int) -> bool:
        return await self._put(tick, "done", owner, revision, self.ttl) is not None

    async def release(self, tick: str, owner: str, revision: int) -> None:
        await self._put(tick, "released", owner, revision, self.lease)

    async def state(self, tick: str) -> str | None:
        try:
            entry = await self._kv.get(self.key(tick))
        except KeyNotFoundError:
            return None
        return msgspec.json.decode(entry.value or b"", type=_Record).state


class _Marker(msgspec.Struct):
    worker: str
    tick: str
    started_ms: int
    beat_ms: int


class RunMarker:
    """``<runs bucket>/<job>`` while a run of ``job`` is in progress. The bucket's TTL removes
    the marker of a worker that died; a heartbeat keeps a live one. A run clears the marker
    only if it is still the one it wrote, so two overlapping runs do not clear each other's."""

    def __init__(self, kv: KeyValue, worker: str) -> None:
        self._kv = kv
        self.worker = worker

    @classmethod
    async def open(cls, js: JetStreamContext, worker: str, bucket: str) -> RunMarker:
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            # Same shape as the replicas provision it, so whoever comes first makes it.
            kv = await js.create_key_value(
                config=KeyValueConfig(
                    bucket=bucket, history=1, ttl=RUN_MARKER_TTL, storage=StorageType.MEMORY
                )
            )
        return cls(kv, worker)

    async def mark(self, job: str, tick: str, started_ms: int) -> int:
        now = int(time.time() * 1000)
        return int(
            await self._kv.put(
                job, msgspec.json.encode(_Marker(self.worker, tick, started_ms, now))
            )
        )

    async def clear(self, job: str, revision: int) -> None:
        with contextlib.suppress(KeyWrongLastSequenceError):
            await self._kv.delete(job, last=revision)


@dataclass
class WorkerStats:
    handled: int = 0  # handler returned
    failed: int = 0  # handler raised (nak, or term after max_deliver)
    duplicates: int = 0  # deliveries of a tick already processed: acked without running
    busy: int = 0  # deliveries while another delivery of the same tick was running
    poison: int = 0  # bodies that are not triggers: terminated


class Worker:
    """Runs ``handler`` for triggers on ``subjects`` from the durable pull consumer
    ``durable`` (created if missing; an existing one is used as it is)."""

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
        processed_ttl: float = 86_400.0,
        run_markers: bool = True,
        runs_bucket: str = DEFAULT_RUNS_BUCKET,
        name: str | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not backoff or any(b <= 0 for b in backoff):
            raise ValueError("backoff needs at least one positive delay")
        if heartbeat >= min(ack_wait, RUN_MARKER_TTL):
            raise ValueError(
                f"heartbeat ({heartbeat:g} s) must be shorter than ack_wait ({ack_wait:g} s) "
                f"and the run marker TTL ({RUN_MARKER_TTL:g} s)"
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

    # ------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.idempotent:
            self.processed = await Processed.open(
                self._js,
                namespace=self.durable,
                bucket=self.processed_bucket,
                ttl=self.processed_ttl,
                lease=max(self.ack_wait, 3 * self.heartbeat),
            )
        if self.run_markers:
            self.markers = await RunMarker.open(self._js, self.name, self.runs_bucket)
        await self._ensure_consumer()
        self._subscription = await self._js.pull_subscribe_bind(
            durable=self.durable, stream=self.stream
        )
        self._loop = asyncio.create_task(self._fetch_loop(), name=f"worker-{self.durable}")

    async def _ensure_consumer(self) -> None:
        try:
            await self._js.consumer_info(self.stream, self.durable)
            return
        except NotFoundError:
            pass
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
        await self._js.add_consumer(self.stream, config=config)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop fetching, let running handlers finish (bounded), then unsubscribe."""
        self._stopping.set()
        if self._loop is not None:
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
        while not self._stopping.is_set():
            free = self.concurrency - len(self._inflight)
            if free <= 0:
                await asyncio.wait(set(self._inflight), return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                messages = await self._subscription.fetch(batch=free, timeout=1.0)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:
                log.warning("fetch from %s failed: %s", self.durable, exc)
                await asyncio.sleep(1.0)
                continue
            for msg in messages:
                task = asyncio.create_task(self.handle(msg))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    # ------------------------------------------------------------------------ one trigger

    def _delay(self, delivered: int) -> float:
        return self.backoff[min(max(delivered, 1), len(self.backoff)) - 1]

    async def handle(self, msg: Msg) -> None:
        """Process one delivery: decode, dedupe, run, ack or nak."""
        headers = dict(msg.headers or {})
        delivered = int(msg.metadata.num_delivered or 1)
        try:
            message = msgspec.json.decode(msg.data, type=TriggerMessage)
        except msgspec.MsgspecError as exc:
            log.error("%s: not a trigger (%s); terminated", msg.subject, exc)
            self.stats.poison += 1
            await msg.term()
            return
        tick = headers.get(HEADER_MSG_ID) or message.tick
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
            revision = 0
            if self.processed is not None:
                state, revision = await self.processed.begin(tick, self.name)
                if state == DONE:
                    span.set_attribute("hrwcron.duplicate", True)
                    self.stats.duplicates += 1
                    await msg.ack_sync()
                    return
                if state == BUSY:
                    span.set_attribute("hrwcron.busy", True)
                    self.stats.busy += 1
                    # The running delivery acks, naks or lets its lease lapse within a lease;
                    # asking sooner would only burn deliveries (max_deliver).
                    await msg.nak(delay=self.processed.lease)
                    return
            trigger = Trigger(message, tick, msg.subject, headers, delivered, msg)
            await self._run(trigger, revision, span)

    async def _run(self, trigger: Trigger, revision: int, span: trace.Span) -> None:
        msg = trigger.msg
        job = trigger.job
        started = int(time.time() * 1000)
        marker = 0
        if self.markers is not None:
            marker = await self.markers.mark(job, trigger.tick, started)
        state = {"revision": revision, "marker": marker}
        beat = asyncio.create_task(self._beat(trigger, started, state))
        try:
            await self.handler(trigger)
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            self.stats.failed += 1
            await self._stop_beat(beat, job, state)
            if self.processed is not None and state["revision"]:
                with contextlib.suppress(Exception):
                    await self.processed.release(trigger.tick, self.name, state["revision"])
            if trigger.delivered >= self.max_deliver:
                log.error(
                    "%s failed on delivery %d of %d, giving up: %s",
                    trigger.tick,
                    trigger.delivered,
                    self.max_deliver,
                    exc,
                )
                await msg.term()
            else:
                delay = self._delay(trigger.delivered)
                log.warning("%s failed (%s); retry in %g s", trigger.tick, exc, delay)
                await msg.nak(delay=delay)
            return
        await self._stop_beat(beat, job, state)
        processed = self.processed
        finished = (
            processed is None
            or not state["revision"]
            or await processed.finish(trigger.tick, self.name, state["revision"])
        )
        if not finished:
            log.warning("%s: processed record changed under this run", trigger.tick)
        self.stats.handled += 1
        await msg.ack_sync()

    async def _stop_beat(self, beat: asyncio.Task[None], job: str, state: dict[str, int]) -> None:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        if self.markers is not None and state["marker"]:
            with contextlib.suppress(Exception):
                await self.markers.clear(job, state["marker"])

    async def _beat(self, trigger: Trigger, started: int, state: dict[str, int]) -> None:
        """While the handler runs: keep the delivery, the processed lease and the run marker
        alive."""
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                await trigger.msg.in_progress()
                if self.processed is not None and state["revision"]:
                    renewed = await self.processed.extend(
                        trigger.tick, self.name, state["revision"]
                    )
                    state["revision"] = renewed or 0
                if self.markers is not None:
                    state["marker"] = await self.markers.mark(trigger.job, trigger.tick, started)
            except Exception as exc:
                log.warning("heartbeat of %s failed: %s", trigger.tick, exc)
