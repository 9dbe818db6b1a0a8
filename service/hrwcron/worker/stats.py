"""What a worker counts, and the Prometheus collector that exports it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


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


class Counted(Protocol):
    """What the collector reads of a worker (a :class:`hrwcron.worker.Worker`)."""

    @property
    def durable(self) -> str: ...

    @property
    def stats(self) -> WorkerStats: ...


class WorkerMetrics(Collector):
    """``hrwcron_worker_events_total{durable, event}``: :class:`WorkerStats` at scrape time."""

    def __init__(self, worker: Counted) -> None:
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
