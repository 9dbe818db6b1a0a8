"""The engine's Observer over Prometheus metrics, OpenTelemetry traces and logs.

Metrics live in a registry this object owns, never the process-global one, so two replicas in
one process (tests, embedding) do not collide. Tracing is off unless asked for; then each tick
decision is a ``hrwcron.tick`` span with children for the claim and the publish, and the
publish span's W3C ``traceparent`` rides in the trigger headers so a worker's span joins the
same trace through the standard propagator. The metric names and collectors are in
:mod:`hrwcron.adapters.metrics`, the span and the tracer set-up in :mod:`hrwcron.adapters.tracing`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
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

from hrwcron import __version__
from hrwcron.adapters.metrics import (
    ATTEMPT_BUCKETS,
    LATENESS_BUCKETS,
    OUTCOMES,
    NatsClientLike,
    NatsCollector,
    OwnerChanges,
    TickCounts,
)
from hrwcron.adapters.tick_log import TickLog
from hrwcron.adapters.tracing import OtelTickSpan, tracer_provider_from_env
from hrwcron.core import resources
from hrwcron.core.config import Config
from hrwcron.core.model import HRW_SCHEME
from hrwcron.core.outcomes import CONTENTION, Outcome
from hrwcron.core.ticks import TickId, format_ms
from hrwcron.engine.ports import LastTrigger, NullSpan, TickSpan

__all__ = ["OUTCOMES", "Fired", "Seen", "Telemetry", "tracer_provider_from_env"]

log = logging.getLogger("hrwcron.telemetry")

_M = TypeVar("_M", Counter, Histogram)
_NULL_SPAN = NullSpan()
_MAX_BAD_JOBS = 100
MISMATCH_GRACE_S = 10.0


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
        claims_bucket: str = resources.CLAIMS_BUCKET,
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
        self.tick_log = TickLog()  # recent troubles and lateness, for the console
        self.feed_is_live = False
        self._mismatch_since: float | None = None
        self._mismatch_warned = False
        self._beat_ok_mono: float | None = None
        self._nats: NatsCollector | None = None
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
        self.ticks = TickCounts(self.per_job)
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
        self.owner_changes = OwnerChanges(self.per_job)
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
        self.refused_replies = Counter(
            "hrwcron_admin_refused_replies",
            "Admin requests left unanswered because their reply subject was not an inbox",
            registry=r,
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
        self._nats = NatsCollector(client)
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
        return OtelTickSpan(span, tracer, due_ms, self.now_ms, self._claims_bucket)

    def claim_ops(self, creates: int, reads: int, replaces: int) -> None:
        for op, count in (("create", creates), ("read", reads), ("replace", replaces)):
            if count:
                self._claim_ops[op].inc(count)

    def outcome(
        self,
        job: str,
        outcome: Outcome,
        *,
        due_ms: int,
        rank: int,
        attempt: int,
        lateness_ms: float | None,
    ) -> None:
        self.ticks.count(job, outcome)
        self.tick_log.note(job, outcome, due_ms, lateness_ms, self.now_ms())
        if lateness_ms is not None:
            self.lateness.observe(max(0.0, lateness_ms) / 1000)
        if outcome == Outcome.STARTED:
            self.attempts.observe(max(1, attempt))
            self.fired[job] = Fired(due_ms, lateness_ms or 0.0, attempt, self.now_ms())
        elif outcome in CONTENTION:
            self.contention.labels(outcome).inc()
        elif outcome == Outcome.ERROR:
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
