"""The :class:`Worker`: pulls triggers from its durable consumer and carries each delivery from
claim to ack (the consumer checks are in :mod:`.setup`, the per-run NATS calls in :mod:`.calls`);
longer than 400 lines because one delivery's path (claim, run, succeed or fail, give back) reads
best top to bottom in one class."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    StorageType,
)
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from hrwcron.core import resources
from hrwcron.core.model import TriggerMessage
from hrwcron.engine.ports import HEADER_MSG_ID
from hrwcron.worker.calls import Run, RunCalls, describe, wait
from hrwcron.worker.errors import WorkerFailpoints, WorkerSettingsError
from hrwcron.worker.records import (
    DEFAULT_PROCESSED_BUCKET,
    DEFAULT_PROCESSED_TTL,
    DEFAULT_RUNS_BUCKET,
    DONE,
    RUN,
    RUN_MARKER_TTL,
    Processed,
    RunMarker,
    now_ms,
)
from hrwcron.worker.setup import ConsumerSetup
from hrwcron.worker.stats import WorkerMetrics, WorkerStats
from hrwcron.worker.trigger import Handler, Trigger

log = logging.getLogger("hrwcron.worker")

DEFAULT_STREAM = resources.TRIGGER_STREAM
DEFAULT_SUBJECTS = (f"{resources.SUBJECT_PREFIX}.>",)
DEFAULT_API_PREFIX = "$JS.API"
FETCH_WAIT = 1.0  # how long one pull request stays open on the server


class Worker(ConsumerSetup, RunCalls):
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
        api_prefix: str | None = None,
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
        # Where the trigger stream's JetStream API answers: "$JS.API" in the scheduler's own
        # account; the import prefix ("$JS.hrwcron.API" in nats/accounts.conf) from a workers'
        # account of its own.
        self.api_prefix = api_prefix or DEFAULT_API_PREFIX
        self._js = client.jetstream(prefix=self.api_prefix)
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
                log.warning("fetch from %s failed: %s", self.durable, describe(exc))
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
        return await wait(self._stopping, seconds)

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
        run = Run(msg, message, tick, headers, delivered, f"{self.name}/{uuid.uuid4().hex[:8]}")
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

    async def _claim(self, run: Run, processed: Processed, span: trace.Span) -> bool:
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
                state, revision = await processed.begin(run.tick, run.owner, run.published_ms)
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

    async def _take_over(self, run: Run, revision: int) -> bool:
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

    async def _run(self, run: Run, span: trace.Span) -> None:
        trigger = Trigger(
            run.message,
            run.tick,
            run.msg.subject,
            run.headers,
            run.delivered,
            run.msg,
            takeover=run.takeover,
        )
        started = now_ms()
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
            except (KeyboardInterrupt, SystemExit) as exc:
                # The process is being stopped: release the tick cleanly for another delivery
                # (counted as a failure of this run), then let the stop go on.
                await self._failed(run, beat, span, exc)
                raise
            except BaseException as exc:
                # Any other exception a handler raises, a BaseException subclass included, is
                # a failure of this run: nak with the configured delay, counted and logged.
                await self._failed(run, beat, span, exc)
                return
            if self._faults:
                await self._faults.hit("worker_handler_returned", run.job)
            await self._stop_beat(run, beat)
            await self._succeeded(run)
        finally:
            run.stop.set()  # whatever happened above, no heartbeat outlives the run

    async def _succeeded(self, run: Run) -> None:
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
        self, run: Run, beat: asyncio.Task[None], span: trace.Span, exc: BaseException
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
                describe(exc),
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
            describe(exc),
            delay,
        )
        await self._nak(run, delay)

    async def _interrupted(self, run: Run, beat: asyncio.Task[None]) -> None:
        self.stats.interrupted += 1
        await self._stop_beat(run, beat)
        await self._release(run)
        await self._clear(run)
        await self._give_back(run, "its handler was cancelled by stop()")

    def _last_delivery(self, run: Run) -> bool:
        return 0 < self.max_deliver <= run.delivered

    async def _give_back(self, run: Run, why: str) -> None:
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
