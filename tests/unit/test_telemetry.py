"""Telemetry as the engine's Observer: metric values, the per-job switch, spans and logs."""

from __future__ import annotations

import http.server
import importlib.util
import json
import logging
import sys
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from harness import wait_for_async
from hrwcron.adapters.memory import MemoryClaims, MemoryJobs, MemoryMembers, MemoryTriggers
from hrwcron.adapters.telemetry import OUTCOMES, Telemetry, tracer_provider_from_env
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import HEADER_MSG_ID, LastTrigger, NullSpan
from hrwcron.engine.scheduler import Scheduler, Settings
from hrwcron.process.logs import JsonFormatter


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sample(t: Telemetry, name: str, **labels: str) -> float | None:
    return t.registry.get_sample_value(name, labels)


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def test_outcomes_become_counts_lateness_and_attempts() -> None:
    t = Telemetry(node="a", process_metrics=False)
    t.outcome("j", "started", due_ms=1000, rank=0, attempt=1, lateness_ms=12.0)
    t.outcome("j", "started", due_ms=2000, rank=1, attempt=2, lateness_ms=1500.0)
    t.outcome("j", "lock_busy", due_ms=3000, rank=0, attempt=1, lateness_ms=None)
    t.outcome("k", "already_claimed", due_ms=3000, rank=1, attempt=0, lateness_ms=None)
    t.outcome("k", "error", due_ms=3000, rank=0, attempt=0, lateness_ms=None)
    t.outcome("k", "missed", due_ms=4000, rank=-1, attempt=0, lateness_ms=None)

    assert sample(t, "hrwcron_ticks_total", outcome="started", job_name="j") == 2
    assert sample(t, "hrwcron_ticks_total", outcome="missed", job_name="k") == 1
    assert sample(t, "hrwcron_ticks_total", outcome="started", job_name="k") is None
    bucket = "hrwcron_tick_lateness_seconds_bucket"
    assert sample(t, bucket, le="0.01") == 0
    assert sample(t, bucket, le="0.025") == 1
    assert sample(t, bucket, le="2.5") == 2
    assert sample(t, "hrwcron_tick_lateness_seconds_sum") == pytest.approx(1.512)
    assert sample(t, bucket, job_name="j", le="2.5") is None  # never labelled per job
    assert sample(t, "hrwcron_tick_attempts_bucket", le="1.0") == 1
    assert sample(t, "hrwcron_tick_attempts_count") == 2
    assert sample(t, "hrwcron_claim_contention_total", reason="lock_busy") == 1
    assert sample(t, "hrwcron_claim_contention_total", reason="already_claimed") == 1
    assert sample(t, "hrwcron_claim_write_failures_total") == 1
    assert t.fired["j"].due_ms == 2000 and t.fired["j"].lateness_ms == 1500.0


def test_state_gauges_follow_the_engine() -> None:
    mono = FakeMonotonic()
    t = Telemetry(node="a", monotonic=mono, process_metrics=False)
    assert sample(t, "hrwcron_heartbeat_age_seconds") == float("inf")  # never beat yet
    t.membership(["a", "b", "c"], 0)
    t.readiness(False, "membership view is stale")
    t.heartbeat(True, offset_ms=-250.0, age_s=0.5)
    t.owned(7)
    t.digest_mismatch(["c"])
    t.bad_job("broken", "schedule: bad field")
    t.owner_changed("j", "a", "b")
    t.owner_changed("j", "b", None)

    assert sample(t, "hrwcron_live_members") == 3
    assert sample(t, "hrwcron_ready") == 0
    assert sample(t, "hrwcron_heartbeat_age_seconds") == pytest.approx(0.5)
    mono.now += 2  # the age keeps growing between heartbeats, as seen at scrape time
    assert sample(t, "hrwcron_heartbeat_age_seconds") == pytest.approx(2.5)
    assert sample(t, "hrwcron_clock_offset_seconds") == pytest.approx(-0.25)
    assert sample(t, "hrwcron_owned_jobs") == 7
    assert sample(t, "hrwcron_job_digest_mismatch") == 1
    assert sample(t, "hrwcron_bad_jobs_total") == 1
    assert sample(t, "hrwcron_owner_changes_total", job_name="j") == 2
    assert t.bad_jobs == {"broken": "schedule: bad field"}
    build = [s for m in t.registry.collect() for s in m.samples if s.name == "hrwcron_build_info"]
    assert build and build[0].labels["node"] == "a" and build[0].value == 1

    t.readiness(True, "")
    t.digest_mismatch([])
    assert sample(t, "hrwcron_ready") == 1
    assert sample(t, "hrwcron_job_digest_mismatch") == 0


def test_a_lasting_digest_mismatch_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    mono = FakeMonotonic()
    t = Telemetry(node="a", monotonic=mono, process_metrics=False)
    with caplog.at_level(logging.INFO, logger="hrwcron.telemetry"):
        t.digest_mismatch(["b"])
        mono.now += 1
        t.digest_mismatch([])  # a replica starting up: shown in the gauge, not logged
        assert caplog.records == []
        for _ in range(15):
            t.digest_mismatch(["b", "c"])
            mono.now += 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "b, c" in warnings[0].getMessage()
    assert sample(t, "hrwcron_job_digest_mismatch") == 2
    with caplog.at_level(logging.INFO, logger="hrwcron.telemetry"):
        t.digest_mismatch([])
    assert "agrees with every live member again" in caplog.records[-1].getMessage()


def test_per_job_labels_can_be_switched_off() -> None:
    t = Telemetry(node="a", per_job=False, process_metrics=False)
    for outcome in OUTCOMES:
        # Every outcome exists from the start, so rate() and alerts see a 0, not nothing.
        assert sample(t, "hrwcron_ticks_total", outcome=outcome) == 0
    t.outcome("j", "started", due_ms=1000, rank=0, attempt=1, lateness_ms=3.0)
    t.outcome("k", "started", due_ms=1000, rank=0, attempt=1, lateness_ms=3.0)
    t.owner_changed("j", "a", "b")
    assert sample(t, "hrwcron_ticks_total", outcome="started") == 2
    assert sample(t, "hrwcron_tick_lateness_seconds_count") == 2
    assert sample(t, "hrwcron_owner_changes_total") == 1
    labels = {key for metric in t.registry.collect() for s in metric.samples for key in s.labels}
    assert "job_name" not in labels


def test_nats_connection_is_read_at_scrape_time() -> None:
    class Client:
        def __init__(self) -> None:
            self.is_connected = True
            self.stats = {"reconnects": 0}

    client = Client()
    t = Telemetry(node="a", process_metrics=False)
    t.track_nats(client)
    assert sample(t, "hrwcron_nats_connected") == 1
    client.is_connected = False
    client.stats["reconnects"] = 3
    assert sample(t, "hrwcron_nats_connected") == 0
    assert sample(t, "hrwcron_nats_reconnects_total") == 3
    t.track_nats(client)  # tracking again replaces, never duplicates
    assert sample(t, "hrwcron_nats_reconnects_total") == 3


def test_tracing_off_costs_a_null_span() -> None:
    t = Telemetry(node="a", process_metrics=False)
    span = t.start_tick_span("j", "j:1000", 1000, 0)
    assert isinstance(span, NullSpan)
    headers: dict[str, str] = {}
    span.inject(headers)
    span.end()
    assert headers == {}


def test_decision_logs_carry_job_tick_node_fields(caplog: pytest.LogCaptureFixture) -> None:
    t = Telemetry(node="a", process_metrics=False)
    with caplog.at_level(logging.DEBUG, logger="hrwcron.telemetry"):
        t.outcome("j", "started", due_ms=1000, rank=0, attempt=1, lateness_ms=4.0)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("tick j:1000")]
    assert record.levelno == logging.DEBUG
    entry = json.loads(JsonFormatter().format(record))
    assert entry["job"] == "j"
    assert entry["tick"] == "j:1000"
    assert entry["node"] == "a"
    assert entry["outcome"] == "started"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hrwcron.telemetry"):
        t.outcome("j", "not_owner", due_ms=2000, rank=1, attempt=0, lateness_ms=None)
        t.readiness(False, "clock is 1500 ms off")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]  # decisions stay at debug
    assert "clock is 1500 ms off" in caplog.records[0].getMessage()


def test_otel_environment_can_disable_or_silence_tracing(caplog: pytest.LogCaptureFixture) -> None:
    assert (
        tracer_provider_from_env({"OTEL_SDK_DISABLED": "true"}, service_name="s", node="a") is None
    )
    with caplog.at_level(logging.INFO, logger="hrwcron.telemetry"):
        provider = tracer_provider_from_env(
            {"OTEL_TRACES_EXPORTER": "none"}, service_name="hrwcron-eu", node="a"
        )
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "hrwcron-eu"
    assert provider.resource.attributes["service.instance.id"] == "a"
    assert "OTLP" not in caplog.text  # "none" means no exporter, and no complaint about one
    provider.shutdown()


def otlp_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:  # a missing parent package raises instead of returning None
        return False


async def test_tick_span_tree_and_traceparent_in_the_trigger(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """A real engine over the in-memory stores: one tick span per decision, claim and publish
    children, and the publish span's context in the trigger's headers."""
    provider, exporter = spans
    t = Telemetry(node="a", tracer_provider=provider, process_metrics=False)
    triggers = MemoryTriggers()
    jobs = MemoryJobs()
    await jobs.put(JobSpec(name="traced", schedule="@every 1s"), None)
    scheduler = Scheduler(
        Settings(node_id="a"),
        members=MemoryMembers(ttl=3.0),
        claims=MemoryClaims(),
        triggers=triggers,
        jobs=jobs,
        observer=t,
    )
    await scheduler.start()
    try:
        await wait_for_async(
            lambda: any(s.name == "hrwcron.tick" for s in exporter.get_finished_spans()),
            timeout=15,
            message="a finished tick span",
        )
    finally:
        await scheduler.stop()

    finished = exporter.get_finished_spans()
    ticks = [s for s in finished if s.name == "hrwcron.tick"]
    tick = ticks[0]
    attrs = dict(tick.attributes or {})
    assert attrs["hrwcron.job"] == "traced"
    assert attrs["hrwcron.outcome"] == "started"
    assert attrs["hrwcron.rank"] == 0
    assert attrs["hrwcron.attempt"] == 1
    assert attrs["hrwcron.tick"] == f"traced:{attrs['hrwcron.due_ms']}"
    assert str(attrs["hrwcron.due"]).endswith("Z")
    assert 0 <= float(attrs["hrwcron.lateness_ms"]) < 60_000  # type: ignore[arg-type]
    assert tick.parent is None  # each tick is its own trace

    children = children_of(tick, finished)
    claim = children["hrwcron.claim"]
    publish = children["publish hrwcron.trigger.traced"]
    assert claim.kind == SpanKind.CLIENT
    assert dict(claim.attributes or {})["hrwcron.claim.won"] is True
    assert publish.kind == SpanKind.PRODUCER
    pattrs = dict(publish.attributes or {})
    assert pattrs["messaging.system"] == "nats"
    assert pattrs["messaging.destination.name"] == "hrwcron.trigger.traced"
    assert pattrs["messaging.message.id"] == attrs["hrwcron.tick"]
    assert publish.status.status_code != StatusCode.ERROR

    # The trigger carries the publish span's W3C context: a worker continues that trace.
    message = next(
        m for m in triggers.messages if m.headers[HEADER_MSG_ID] == attrs["hrwcron.tick"]
    )
    traceparent = message.headers["traceparent"]
    assert publish.context is not None
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    assert trace_id == f"{publish.context.trace_id:032x}"
    assert span_id == f"{publish.context.span_id:016x}"
    worker_parent = TraceContextTextMapPropagator().extract(message.headers)
    worker_tracer = provider.get_tracer("worker")
    with worker_tracer.start_as_current_span("process", context=worker_parent) as worker:
        pass
    worker_span = next(s for s in exporter.get_finished_spans() if s.name == "process")
    assert worker_span.parent is not None
    assert worker_span.parent.span_id == publish.context.span_id
    assert worker.get_span_context().trace_id == tick.context.trace_id


def children_of(
    parent: ReadableSpan, finished: tuple[ReadableSpan, ...]
) -> dict[str, ReadableSpan]:
    assert parent.context is not None
    return {
        s.name: s
        for s in finished
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    }


async def test_spans_record_errors_and_seen_triggers() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    t = Telemetry(node="a", tracer_provider=provider, process_metrics=False)
    span = t.start_tick_span("j", "j:1000", 1000, 2)
    span.set("error", "claim write timed out")
    span.set("outcome", "error")
    span.end()
    (tick,) = exporter.get_finished_spans()
    assert tick.status.status_code == StatusCode.ERROR
    assert dict(tick.attributes or {})["hrwcron.rank"] == 2
    t.trigger_seen("hrwcron.trigger.j", LastTrigger(5, "j:1000", 1000))
    assert not t.seen["hrwcron.trigger.j"].live  # replayed history, before history_loaded
    t.history_loaded()
    t.trigger_seen("hrwcron.trigger.j", LastTrigger(6, "j:2000", 2000))
    assert t.seen["hrwcron.trigger.j"].live and t.seen["hrwcron.trigger.j"].seq == 6
    await t.shutdown()


class FakeCollector:
    """An OTLP/HTTP trace receiver on loopback that keeps every export request."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                if self.path == "/v1/traces":
                    collector.bodies.append(self.rfile.read(length))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeCollector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.skipif(not otlp_installed(), reason="the 'otlp' extra is not installed")
async def test_spans_reach_an_otlp_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    with FakeCollector() as collector:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
            "OTEL_SERVICE_NAME": "cron-eu",
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)  # the SDK reads os.environ itself
        provider = tracer_provider_from_env(env, service_name="hrwcron", node="a")
        assert provider is not None
        t = Telemetry(node="a", tracer_provider=provider, process_metrics=False)
        span = t.start_tick_span("j", "j:1000", 1000, 0)
        span.set("outcome", "started")
        span.end()
        await t.shutdown(timeout=10)  # flushes the batch processor
        assert collector.bodies, "the collector received no export request"
    request = ExportTraceServiceRequest.FromString(collector.bodies[0])
    (resource_spans,) = request.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "cron-eu"  # OTEL_SERVICE_NAME beats the config default
    assert resource["service.instance.id"] == "a"
    assert resource["deployment.environment"] == "test"
    names = [s.name for scope in resource_spans.scope_spans for s in scope.spans]
    assert names == ["hrwcron.tick"]


def test_without_the_otlp_extra_spans_are_made_but_not_exported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # None in sys.modules makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with caplog.at_level(logging.WARNING, logger="hrwcron.telemetry"):
        provider = tracer_provider_from_env({}, service_name="hrwcron", node="a")
    assert provider is not None
    assert "pip install 'hrwcron[otlp]'" in caplog.text
    t = Telemetry(node="a", tracer_provider=provider, process_metrics=False)
    span = t.start_tick_span("j", "j:1000", 1000, 0)
    headers: dict[str, str] = {}
    span.inject(headers)
    span.end()
    assert headers["traceparent"].startswith("00-")  # workers still join the tick's trace
    provider.shutdown()
