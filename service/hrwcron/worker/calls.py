"""One delivery of a trigger (:class:`Run`) and the NATS calls the worker makes for it: ack,
nak, the processed record, the run marker and the heartbeat that renews them; every failed
call is counted and logged with the tick key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from hrwcron.core.model import TriggerMessage
from hrwcron.worker.errors import WorkerFailpoints
from hrwcron.worker.records import (
    RUN_MARKER_TTL,
    Processed,
    RunMarker,
)
from hrwcron.worker.stats import WorkerStats

log = logging.getLogger("hrwcron.worker")

_QUIET = 10.0  # seconds between two log lines about the same failure of one run


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass
class Run:
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

    @property
    def published_ms(self) -> int | None:
        """When the trigger was stored in the stream (None when the message does not say)."""
        try:
            stamp = self.msg.metadata.timestamp
        except Exception:  # not a JetStream message (a test's stand-in)
            return None
        return None if stamp is None else int(stamp.timestamp() * 1000)


class RunCalls:
    """The per-run NATS calls of :class:`~hrwcron.worker.consumer.Worker`, which sets these."""

    ack_wait: float
    heartbeat: float
    processed: Processed | None
    markers: RunMarker | None
    stats: WorkerStats
    _faults: WorkerFailpoints

    def _error(self, run: Run, what: str, exc: BaseException, then: str = "") -> None:
        """Count a failed NATS call and log it with the tick key (the same failure of the
        same run at most every few seconds, so an outage does not flood the log)."""
        self.stats.errors += 1
        now = time.monotonic()
        if run.quiet_until.get(what, 0.0) > now:
            return
        run.quiet_until[what] = now + _QUIET
        log.warning("%s: %s: %s%s", run.tick, what, describe(exc), f"; {then}" if then else "")

    async def _keep(self, run: Run) -> None:
        try:
            await run.msg.in_progress()
        except Exception as exc:
            self._error(run, "in-progress ack failed", exc)

    async def _ack(self, run: Run) -> bool:
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

    async def _nak(self, run: Run, delay: float) -> None:
        try:
            await run.msg.nak(delay=delay or None)
        except Exception as exc:
            self._error(run, "nak failed", exc, "redelivered once ack_wait lapses")

    async def _record_done(self, run: Run) -> bool:
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

    async def _release(self, run: Run) -> None:
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

    def _lost(self, run: Run) -> None:
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

    async def _mark(self, run: Run, started: int) -> None:
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

    async def _clear(self, run: Run) -> None:
        if self.markers is None:
            return
        try:
            await self.markers.clear(run.job, run.owner)
        except Exception as exc:
            self._error(
                run, "cannot clear its run marker", exc, f"it expires within {RUN_MARKER_TTL:g} s"
            )

    # ------------------------------------------------------------------------ heartbeat

    async def _stop_beat(self, run: Run, beat: asyncio.Task[None]) -> None:
        """Let the heartbeat finish the write it is in, then end it. Cancelling it there
        would lose the revision that write produced (and a later write would then fail)."""
        run.stop.set()
        await asyncio.shield(beat)

    async def _beat(self, run: Run, started: int, due: float) -> None:
        """While the handler runs: keep the delivery, the processed record and the run
        marker alive, and notice when the event loop was blocked."""
        loop = asyncio.get_running_loop()
        while True:
            stopped = await wait(run.stop, due - loop.time())
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

    async def _beat_once(self, run: Run, started: int) -> None:
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


async def wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``; True if it is set."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, seconds))
    return event.is_set()
