"""The :class:`Worker`: pulls triggers from its durable consumer and carries each delivery from
claim to ack; longer than 400 lines because one delivery's path (claim, run, heartbeat, settle)
reads best top to bottom in one class."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    StorageType,
    StreamInfo,
)
from nats.js.errors import NotFoundError
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from hrwcron.core.model import TriggerMessage
from hrwcron.engine.ports import HEADER_MSG_ID
from hrwcron.worker.errors import WorkerFailpoints, WorkerSettingsError, WorkerSetupError
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
from hrwcron.worker.stats import WorkerMetrics, WorkerStats
from hrwcron.worker.trigger import Handler, Trigger

log = logging.getLogger("hrwcron.worker")

DEFAULT_STREAM = "HRWCRON_TRIGGERS"
DEFAULT_SUBJECTS = ("hrwcron.trigger.>",)
FETCH_WAIT = 1.0  # how long one pull request stays open on the server
_QUIET = 10.0  # seconds between two log lines about the same failure of one run


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


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
