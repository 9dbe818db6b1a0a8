"""The engine's Observer over Prometheus metrics, OpenTelemetry traces and logs.

Metrics live in a registry this object owns, never the process-global one, so two replicas in
one process (tests, embedding) do not collide. Tracing is off unless asked for; then each tick
decision is a ``hrwcron.tick`` span with children for the claim and the publish, and the
publish span's W3C ``traceparent`` rides in the trigger headers so a worker's span joins the
same trace through the standard propagator.
"""

from __future__ import annotations

import asyncio
import logging
import math
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hrwcron import __version__
from hrwcron.core.config import Config
from hrwcron.core.model import HRW_SCHEME
from hrwcron.core.ticks import TickId, format_ms
from hrwcron.engine.ports import LastTrigger, NullSpan, TickSpan

log = logging.getLogger("hrwcron.telemetry")

OUTCOMES = (
    "started",
    "already_claimed",
    "not_owner",
    "lock_busy",
    "duplicate",
    "missed",
    "fenced",
    "skipped",
    "excluded",
    "max_runs",
    "rejected",
    "error",
)
CONTENTION = frozenset({"lock_busy", "already_claimed"})
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
_PROPAGATOR = TraceContextTextMapPropagator()
_M = TypeVar("_M", Counter, Histogram)
_NULL_SPAN = NullSpan()
_MAX_BAD_JOBS = 100
MISMATCH_GRACE_S = 10.0


class NatsClientLike(Protocol):
    """What the NATS metrics read from a client at scrape time (nats-py's Client fits)."""

    @property
    def is_connected(self) -> bool: ...

    stats: dict[str, int]


@dataclass(frozen=True, slots=True)
class Fired:
    """A trigger this replica published: its due instant and how late the PubAck came."""

    due_ms: int
    lateness_ms: float
    attempt: int
    at_ms: float


@dataclass(frozen=True, slots=True)
class Seen:
    """When the newest trigger of a subject (its stream sequence) went by here; ``live`` is
    false for the history replayed at start-up, whose arrival time means nothing. One per
    subject, so it holds only what the engine's own last-trigger table does not."""

    seq: int
    seen_ms: float
    live: bool


_REPLAYED = Seen(0, 0.0, False)


class _NatsCollector(Collector):
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


class _TickCounts(Collector):
    """``hrwcron_ticks_total{outcome[, job_name]}``: a dict of counts per outcome, looked up
    once per tick (most jobs only ever see one outcome on a replica: fired here, or by
    another); an outcome never seen for a job is no series (per job) or a 0 (without per-job
    labels, so rate() and alerts see every outcome from the start)."""

    def __init__(self, per_job: bool) -> None:
        self.per_job = per_job
        self._by_outcome: dict[str, dict[str, int]] = {o: {} for o in OUTCOMES}
        self._total = dict.fromkeys(OUTCOMES, 0)

    def count(self, job: str, outcome: str) -> None:
        if not self.per_job:
            self._total[outcome] = self._total.get(outcome, 0) + 1
            return
        counts = self._by_outcome.get(outcome)
        if counts is None:
            counts = self._by_outcome[outcome] = {}
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


class _OwnerChanges(Collector):
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


class _Span:
    """A TickSpan over an OpenTelemetry span."""

    __slots__ = ("_claims_bucket", "_due_ms", "_now_ms", "_span", "_tracer")

    def __init__(
        self,
        span: trace.Span,
        tracer: trace.Tracer,
        due_ms: int,
        now_ms: Callable[[], float],
        claims_bucket: str,
    ) -> None:
        self._span = span
        self._tracer = tracer
        self._due_ms = due_ms
        self._now_ms = now_ms
        self._claims_bucket = claims_bucket

    def set(self, key: str, value: str | int | float | bool) -> None:
        name = key if "." in key else f"hrwcron.{key}"
        self._span.set_attribute(name, value)
        if key == "error":
            self._span.set_status(Status(StatusCode.ERROR, str(value)))
        elif key == "outcome" and value == "started":
            # Set right after the PubAck: the same lateness the histogram records.
            self._span.set_attribute("hrwcron.lateness_ms", self._now_ms() - self._due_ms)

    def start_child(
        self, name: str, attributes: Mapping[str, str | int | float | bool]
    ) -> TickSpan:
        attrs = dict(attributes)
        publish = attrs.get("messaging.operation.type") == "publish"
        if publish:
            attrs.setdefault("messaging.operation.name", "publish")
        elif "hrwcron.claim.key" in attrs:
            # A claim is a create-only KV write: a JetStream publish to the bucket's subject.
            attrs.setdefault("messaging.system", "nats")
            attrs.setdefault(
                "messaging.destination.name",
                f"$KV.{self._claims_bucket}.{attrs['hrwcron.claim.key']}",
            )
            attrs.setdefault("messaging.operation.name", "kv.create")
        context = trace.set_span_in_context(self._span)
        kind = SpanKind.PRODUCER if publish else SpanKind.CLIENT
        span = self._tracer.start_span(name, context=context, kind=kind, attributes=attrs)
        return _Span(span, self._tracer, self._due_ms, self._now_ms, self._claims_bucket)

    def end(self) -> None:
        self._span.end()

    def inject(self, headers: dict[str, str]) -> None:
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(self._span))


def tracer_provider_from_env(
    env: Mapping[str, str], *, service_name: str, node: str
) -> TracerProvider | None:
    """A TracerProvider configured by the standard OTEL_* variables, or None when the SDK is
    disabled. The OTLP exporter is optional (the ``otlp`` extra): without it spans are still
    made, so ``traceparent`` still links workers to ticks, but nothing is exported."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.info("tracing is on in the config but OTEL_SDK_DISABLED=true; no spans")
        return None
    # Defaults only: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win, as operators expect,
    # while Resource.create would let these programmatic values override them.
    defaults = {"service.name": service_name, "service.instance.id": node}
    from_env = {
        pair.split("=", 1)[0].strip() for pair in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    }
    if env.get("OTEL_SERVICE_NAME"):
        from_env.add("service.name")
    resource = Resource.create({k: v for k, v in defaults.items() if k not in from_env})
    provider = TracerProvider(resource=resource)
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    for name in filter(None, names):
        exporter = _exporter(name, env)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter | None:
    if name == "none":
        return None
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (otlp, console, none)", name)
        return None
    protocol = env.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol.strip().lower() == "grpc":
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported; use http/protobuf "
            "(the OTLP collector's port 4318); spans are not exported"
        )
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError:
        log.warning(
            "tracing is on but the OTLP exporter is not installed "
            "(pip install 'hrwcron[otlp]'); spans are made for trace propagation only"
        )
        return None
    exporter: SpanExporter = OTLPSpanExporter()
    log.info("exporting spans over OTLP/HTTP (configured by OTEL_EXPORTER_OTLP_* variables)")
    return exporter


class Telemetry:
    """Implements the engine's Observer. ``now_ms`` must be the scheduler's server-corrected
    clock so lateness here matches the engine's; ``monotonic`` its lease clock."""

    def __init__(
        self,
        *,
        node: str,
        per_job: bool = True,
        tracer_provider: TracerProvider | None = None,
        now_ms: Callable[[], float] = lambda: time.time() * 1000,
        monotonic: Callable[[], float] = time.monotonic,
        claims_bucket: str = "hrwcron_claims",
        process_metrics: bool = True,
    ) -> None:
        self.node = node
        self.per_job = per_job
        self.now_ms = now_ms
        self._monotonic = monotonic
        self._claims_bucket = claims_bucket
        # ``*_created`` series would double the per-job series for a timestamp nobody reads.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self._provider = tracer_provider
        self._tracer = (
            tracer_provider.get_tracer("hrwcron", __version__) if tracer_provider else None
        )
        self.tracing = self._tracer is not None
        self.ready = False
        self.not_ready_reason = "starting"
        self.live: list[str] = []
        self.owned_count = 0
        self.offset_ms = 0.0
        self.mismatched: list[str] = []
        self.fired: dict[str, Fired] = {}
        self.seen: dict[str, Seen] = {}
        self.bad_jobs: dict[str, str] = {}
        self.feed_is_live = False
        self._mismatch_since: float | None = None
        self._mismatch_warned = False
        self._beat_ok_mono: float | None = None
        self._nats: _NatsCollector | None = None
        self._define_metrics(process_metrics)

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        node: str,
        env: Mapping[str, str],
        now_ms: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> Telemetry:
        """Build from ``scheduler.per_job_metrics``, ``telemetry.traces`` and
        ``telemetry.service_name``."""
        provider = None
        if config.telemetry.traces:
            provider = tracer_provider_from_env(
                env, service_name=config.telemetry.service_name, node=node
            )
        return cls(
            node=node,
            per_job=config.scheduler.per_job_metrics,
            tracer_provider=provider,
            now_ms=now_ms,
            monotonic=monotonic,
            claims_bucket=config.scheduler.claims_bucket,
        )

    # ------------------------------------------------------------------------- metrics

    def _define_metrics(self, process_metrics: bool) -> None:
        r = self.registry
        # Counted in plain lists and exposed at scrape time: a prometheus_client child per
        # job costs a label lookup per tick and a lock and about a kilobyte per series.
        self.ticks = _TickCounts(self.per_job)
        r.register(self.ticks)
        # No job label even with per-job metrics: a histogram per job costs a series per
        # bucket, and 100,000 jobs would hold millions of series in every replica.
        self.lateness = Histogram(
            "hrwcron_tick_lateness_seconds",
            "From a tick's nominal due instant to the trigger's PubAck (server clock)",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.attempts = Histogram(
            "hrwcron_tick_attempts",
            "Claim attempt that published a trigger (1 = first claim, more = takeovers)",
            buckets=ATTEMPT_BUCKETS,
            registry=r,
        )
        self.contention = Counter(
            "hrwcron_claim_contention",
            "Claims found held by another replica (lock_busy, already_claimed)",
            ("reason",),
            registry=r,
        )
        claim_ops = Counter(
            "hrwcron_claim_ops",
            "Operations on the claims bucket by kind: a healthy tick costs one create",
            ("op",),
            registry=r,
        )
        self._claim_ops = {op: claim_ops.labels(op) for op in ("create", "read", "replace")}
        self.claim_failures = Counter(
            "hrwcron_claim_write_failures",
            "Claim or publish attempts that failed with an error (timeouts, lost connection)",
            registry=r,
        )
        self.owner_changes = _OwnerChanges(self.per_job)
        r.register(self.owner_changes)
        self.live_members = Gauge(
            "hrwcron_live_members", "Live, ready members in this replica's view", registry=r
        )
        self.ready_gauge = Gauge(
            "hrwcron_ready", "1 when this replica may claim ticks, 0 when not ready", registry=r
        )
        self.heartbeat_age = Gauge(
            "hrwcron_heartbeat_age_seconds",
            "Seconds since this replica's heartbeat last reached NATS",
            registry=r,
        )
        self.heartbeat_age.set_function(self._heartbeat_age)
        self.clock_offset = Gauge(
            "hrwcron_clock_offset_seconds",
            "Estimated NATS server clock minus this host's clock",
            registry=r,
        )
        self.owned_gauge = Gauge(
            "hrwcron_owned_jobs", "Jobs this replica owns (rank 0) right now", registry=r
        )
        self.digest_mismatch_gauge = Gauge(
            "hrwcron_job_digest_mismatch",
            "Live members whose job-set digest differs from this replica's",
            registry=r,
        )
        self.bad_jobs_total = Counter(
            "hrwcron_bad_jobs", "Job specs rejected as invalid (each bad revision)", registry=r
        )
        self.build = Info("hrwcron_build", "Version of this replica", registry=r)
        self.build.info(
            {
                "version": __version__,
                "hrw": HRW_SCHEME,
                "python": platform.python_version(),
                "node": self.node,
            }
        )
        for reason in sorted(CONTENTION):
            self.contention.labels(reason)
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)

    def track_nats(self, client: NatsClientLike) -> None:
        """Export the connection state and reconnect count of ``client``, read at scrape."""
        if self._nats is not None:
            self.registry.unregister(self._nats)
        self._nats = _NatsCollector(client)
        self.registry.register(self._nats)

    def _heartbeat_age(self) -> float:
        if self._beat_ok_mono is None:
            return math.inf
        return max(0.0, self._monotonic() - self._beat_ok_mono)

    # ------------------------------------------------------------------------ Observer

    def start_tick_span(self, job: str, tick_key: str, due_ms: int, rank: int) -> TickSpan:
        tracer = self._tracer
        if tracer is None:
            return _NULL_SPAN
        attributes: dict[str, str | int] = {
            "hrwcron.job": job,
            "hrwcron.tick": tick_key,
            "hrwcron.due": format_ms(due_ms),
            "hrwcron.due_ms": due_ms,
            "hrwcron.rank": rank,
            "hrwcron.node": self.node,
        }
        # A fresh root: a tick is its own trace, whatever task context it was started from.
        span = tracer.start_span(
            "hrwcron.tick", context=Context(), kind=SpanKind.INTERNAL, attributes=attributes
        )
        return _Span(span, tracer, due_ms, self.now_ms, self._claims_bucket)

    def claim_ops(self, creates: int, reads: int, replaces: int) -> None:
        for op, count in (("create", creates), ("read", reads), ("replace", replaces)):
            if count:
                self._claim_ops[op].inc(count)

    def outcome(
        self,
        job: str,
        outcome: str,
        *,
        due_ms: int,
        rank: int,
        attempt: int,
        lateness_ms: float | None,
    ) -> None:
        self.ticks.count(job, outcome)
        if lateness_ms is not None:
            self.lateness.observe(max(0.0, lateness_ms) / 1000)
        if outcome == "started":
            self.attempts.observe(max(1, attempt))
            self.fired[job] = Fired(due_ms, lateness_ms or 0.0, attempt, self.now_ms())
        elif outcome in CONTENTION:
            self.contention.labels(outcome).inc()
        elif outcome == "error":
            self.claim_failures.inc()
        if log.isEnabledFor(logging.DEBUG):
            tick = TickId(job, due_ms).key
            late = "" if lateness_ms is None else f", {lateness_ms:.1f} ms late"
            log.debug(
                "tick %s: %s (rank %d, attempt %d%s)",
                tick,
                outcome,
                rank,
                attempt,
                late,
                extra={
                    "job": job,
                    "tick": tick,
                    "node": self.node,
                    "outcome": outcome,
                    "rank": rank,
                    "attempt": attempt,
                },
            )

    def membership(self, live: list[str], changed_owners: int) -> None:
        # The engine logs membership changes itself; this keeps the numbers.
        self.live = list(live)
        self.live_members.set(len(live))

    def readiness(self, ready: bool, reason: str) -> None:
        was = self.ready
        self.ready, self.not_ready_reason = ready, reason
        self.ready_gauge.set(1 if ready else 0)
        if ready and not was:
            log.info("ready: claiming ticks", extra={"node": self.node})
        elif not ready:
            log.warning("not ready, not claiming: %s", reason, extra={"node": self.node})

    def heartbeat(self, ok: bool, offset_ms: float, age_s: float) -> None:
        self.offset_ms = offset_ms
        self.clock_offset.set(offset_ms / 1000)
        if math.isfinite(age_s):
            self._beat_ok_mono = self._monotonic() - age_s

    def bad_job(self, name: str, error: str) -> None:
        self.bad_jobs_total.inc()
        self.bad_jobs.pop(name, None)
        self.bad_jobs[name] = error
        while len(self.bad_jobs) > _MAX_BAD_JOBS:
            del self.bad_jobs[next(iter(self.bad_jobs))]

    def trigger_seen(self, subject: str, last: LastTrigger) -> None:
        # Replayed history needs no object of its own: it is never compared with anything.
        self.seen[subject] = Seen(last.seq, self.now_ms(), True) if self.feed_is_live else _REPLAYED

    def history_loaded(self) -> None:
        """Call once the scheduler has started: triggers seen from now on arrive live."""
        self.feed_is_live = True

    def digest_mismatch(self, mismatched: list[str]) -> None:
        self.mismatched = sorted(mismatched)
        self.digest_mismatch_gauge.set(len(mismatched))
        now = self._monotonic()
        if not mismatched:
            if self._mismatch_warned:
                log.info("job set agrees with every live member again", extra={"node": self.node})
            self._mismatch_since, self._mismatch_warned = None, False
            return
        if self._mismatch_since is None:
            self._mismatch_since = now
        # Replicas starting or a job being edited disagree for a heartbeat or two; only a
        # lasting difference is worth a warning (the gauge shows every moment of it).
        if not self._mismatch_warned and now - self._mismatch_since >= MISMATCH_GRACE_S:
            self._mismatch_warned = True
            log.warning(
                "job set differs from members %s for %.0f s (a jobs watch is behind, or "
                "versions disagree); they may disagree on owners until it converges",
                ", ".join(self.mismatched),
                now - self._mismatch_since,
                extra={"node": self.node},
            )

    def owned(self, count: int) -> None:
        self.owned_count = count
        self.owned_gauge.set(count)

    def owner_changed(self, job: str, previous: str | None, owner: str | None) -> None:
        self.owner_changes.count(job)
        # Debug only: one member leaving moves a third of all jobs at once; the engine logs
        # the membership change itself at info.
        log.debug(
            "job %s: owner %s -> %s",
            job,
            previous or "none",
            owner or "none",
            extra={"job": job, "node": self.node},
        )

    # ------------------------------------------------------------------------ lifecycle

    async def shutdown(self, timeout: float = 2.0) -> None:
        """Flush spans still queued for export, bounded, without blocking the event loop."""
        if self._provider is None:
            return
        provider = self._provider
        self._provider = None
        try:
            await asyncio.wait_for(asyncio.to_thread(provider.shutdown), timeout)
        except Exception as exc:  # an unreachable collector must not hang the shutdown
            log.warning("span export did not finish at shutdown: %r", exc)
