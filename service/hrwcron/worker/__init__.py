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

from hrwcron.worker.consumer import DEFAULT_STREAM, DEFAULT_SUBJECTS, FETCH_WAIT, Worker
from hrwcron.worker.errors import (
    FailpointError,
    WorkerFailpoints,
    WorkerSettingsError,
    WorkerSetupError,
)
from hrwcron.worker.records import (
    BUSY,
    DEFAULT_PROCESSED_BUCKET,
    DEFAULT_PROCESSED_TTL,
    DEFAULT_RUNS_BUCKET,
    DONE,
    FINISHED,
    RELEASED,
    RUN,
    RUN_MARKER_TTL,
    RUNNING,
    Processed,
    RunMarker,
)
from hrwcron.worker.stats import WorkerMetrics, WorkerStats
from hrwcron.worker.trigger import Handler, Trigger

__all__ = [
    "BUSY",
    "DEFAULT_PROCESSED_BUCKET",
    "DEFAULT_PROCESSED_TTL",
    "DEFAULT_RUNS_BUCKET",
    "DEFAULT_STREAM",
    "DEFAULT_SUBJECTS",
    "DONE",
    "FETCH_WAIT",
    "FINISHED",
    "RELEASED",
    "RUN",
    "RUNNING",
    "RUN_MARKER_TTL",
    "FailpointError",
    "Handler",
    "Processed",
    "RunMarker",
    "Trigger",
    "Worker",
    "WorkerFailpoints",
    "WorkerMetrics",
    "WorkerSettingsError",
    "WorkerSetupError",
    "WorkerStats",
]
