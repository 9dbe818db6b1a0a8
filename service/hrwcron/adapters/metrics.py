"""The replica's Prometheus vocabulary: tick outcomes, histogram buckets, and the collectors
that count per outcome and job or read the NATS client at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hrwcron.core.outcomes import Outcome

# Every outcome is counted from the start (a 0, not a missing series).
OUTCOMES = tuple(Outcome)
# 1 ms .. 60 s: a healthy tick lands in the low milliseconds, a failover one step (1 s) later,
# and anything past a minute is at the default max_lateness anyway.
LATENESS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 10)


class NatsClientLike(Protocol):
    """What the NATS metrics read from a client at scrape time (nats-py's Client fits)."""

    @property
    def is_connected(self) -> bool: ...

    stats: dict[str, int]


class NatsCollector(Collector):
    def __init__(self, client: NatsClientLike) -> None:
        self._client = client

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        connected = GaugeMetricFamily(
            "hrwcron_nats_connected", "1 while the NATS connection is up, 0 otherwise"
        )
        connected.add_metric([], 1.0 if self._client.is_connected else 0.0)
        yield connected
        reconnects = CounterMetricFamily(
            "hrwcron_nats_reconnects", "Reconnections to NATS since the process started"
        )
        reconnects.add_metric([], float(self._client.stats.get("reconnects", 0)))
        yield reconnects

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return iter(())


# Not "job": Prometheus puts its own scrape-job name in that label.
JOB_LABEL = "job_name"


class TickCounts(Collector):
    """``hrwcron_ticks_total{outcome[, job_name]}``: a dict of counts per outcome, looked up
    once per tick (most jobs only ever see one outcome on a replica: fired here, or by
    another); an outcome never seen for a job is no series (per job) or a 0 (without per-job
    labels, so rate() and alerts see every outcome from the start)."""

    def __init__(self, per_job: bool) -> None:
        self.per_job = per_job
        self._by_outcome: dict[str, dict[str, int]] = {o: {} for o in OUTCOMES}
        self._total = dict.fromkeys(OUTCOMES, 0)

    def count(self, job: str, outcome: Outcome) -> None:
        if not self.per_job:
            self._total[outcome] += 1  # an outcome not in OUTCOMES is a KeyError, not a series
            return
        counts = self._by_outcome[outcome]
        counts[job] = counts.get(job, 0) + 1

    def collect(self) -> Iterator[CounterMetricFamily]:
        doc = "Tick decisions of this replica by outcome (and job)"
        if not self.per_job:
            family = CounterMetricFamily("hrwcron_ticks", doc, labels=["outcome"])
            for name, value in list(self._total.items()):
                family.add_metric([name], float(value))
            yield family
            return
        family = CounterMetricFamily("hrwcron_ticks", doc, labels=["outcome", JOB_LABEL])
        for outcome, counts in list(self._by_outcome.items()):
            for job, value in list(counts.items()):
                family.add_metric([outcome, job], float(value))
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())


class OwnerChanges(Collector):
    """``hrwcron_owner_changes_total[{job_name}]``, counted in a plain dict."""

    def __init__(self, per_job: bool) -> None:
        self.per_job = per_job
        self._by_job: dict[str, int] = {}
        self._total = 0

    def count(self, job: str) -> None:
        if self.per_job:
            self._by_job[job] = self._by_job.get(job, 0) + 1
        else:
            self._total += 1

    def collect(self) -> Iterator[CounterMetricFamily]:
        doc = "Times this replica saw a job's owner change at a tick"
        if not self.per_job:
            family = CounterMetricFamily("hrwcron_owner_changes", doc)
            family.add_metric([], float(self._total))
            yield family
            return
        family = CounterMetricFamily("hrwcron_owner_changes", doc, labels=[JOB_LABEL])
        for job, value in list(self._by_job.items()):
            family.add_metric([job], float(value))
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())
