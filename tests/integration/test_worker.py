"""The worker SDK on a real nats-server: once per tick despite redelivery, retries with
backoff, trace continuation, poison messages, and run markers that make the scheduler skip."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from harness import wait_for_async
from harness.inprocess_replicas import Cluster, scheduled_dues
from harness.worker_records import publish
from hrwcron.core.model import JobSpec
from hrwcron.worker import DONE, Processed, Trigger, Worker

DEADLINE = 20.0


async def test_redelivery_while_running_runs_the_handler_once(nc: Client) -> None:
    runs: list[tuple[str, int]] = []
    release = asyncio.Event()

    async def slow(trigger: Trigger) -> None:
        runs.append((trigger.tick, trigger.delivered))
        await release.wait()

    worker = Worker(nc, slow, durable="once", ack_wait=1.0, heartbeat=0.5, run_markers=False)
    await worker.start()
    # A heartbeat slower than ack_wait (the constructor and start() refuse it) stops the
    # in-progress acks, so the server redelivers while the first run is busy, as after lost acks.
    worker.heartbeat = 5.0
    try:
        tick = await publish(nc, "report", 1_000)
        await wait_for_async(lambda: worker.stats.busy >= 1, timeout=DEADLINE)
        release.set()
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        info = await nc.jetstream().consumer_info("HRWCRON_TRIGGERS", "once")
        assert info.num_ack_pending == 0  # the first run's ack settled every delivery
        assert runs == [(tick, 1)]
        assert await worker.processed.state(tick) == DONE  # type: ignore[union-attr]
        # Another consumer (another purpose) keeps its own record and does run it.
        other = await Processed.open(nc.jetstream(), namespace="audit")
        assert (await other.begin(tick, "auditor"))[0] == "run"
    finally:
        await worker.stop()


async def test_trigger_processed_before_a_crash_is_acked_without_running(nc: Client) -> None:
    js = nc.jetstream()
    await js.add_consumer(
        "HRWCRON_TRIGGERS",
        ConsumerConfig(
            durable_name="crashy",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=1.0,
            filter_subject="hrwcron.trigger.crashy",
        ),
    )
    tick = await publish(nc, "crashy", 5_000)
    # A worker that ran the handler and recorded it, then died before its ack reached NATS.
    crashed = await js.pull_subscribe_bind(durable="crashy", stream="HRWCRON_TRIGGERS")
    (first,) = await crashed.fetch(1, timeout=5)
    processed = await Processed.open(js, namespace="crashy")
    state, revision = await processed.begin(tick, "crashed-worker")
    assert state == "run"
    assert await processed.finish(tick, "crashed-worker", revision)
    await crashed.unsubscribe()

    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    worker = Worker(
        nc,
        handler,
        durable="crashy",
        subjects="hrwcron.trigger.crashy",
        heartbeat=0.5,  # at most half the consumer's ack_wait, or start() refuses it
        run_markers=False,
    )
    await worker.start()
    try:
        await wait_for_async(lambda: worker.stats.duplicates == 1, timeout=DEADLINE)
        info = await js.consumer_info("HRWCRON_TRIGGERS", "crashy")
        assert info.num_ack_pending == 0
        assert runs == []
        assert first.metadata.num_delivered == 1
    finally:
        await worker.stop()


async def test_failed_handler_is_retried_with_backoff_then_acked(nc: Client) -> None:
    deliveries: list[int] = []

    async def flaky(trigger: Trigger) -> None:
        deliveries.append(trigger.delivered)
        if trigger.delivered == 1:
            raise RuntimeError("downstream not ready")

    worker = Worker(nc, flaky, durable="flaky", backoff=[0.3], run_markers=False)
    await worker.start()
    try:
        tick = await publish(nc, "flaky", 2_000)
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        assert deliveries == [1, 2]
        assert worker.stats.failed == 1
        assert await worker.processed.state(tick) == DONE  # type: ignore[union-attr]
        info = await nc.jetstream().consumer_info("HRWCRON_TRIGGERS", "flaky")
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await worker.stop()


async def test_handler_span_continues_the_publishers_trace(nc: Client) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    seen: list[str] = []

    async def handler(trigger: Trigger) -> None:
        seen.append(trigger.tick)

    worker = Worker(nc, handler, durable="traced", tracer=tracer, run_markers=False)
    await worker.start()
    try:
        with tracer.start_as_current_span("publish hrwcron.trigger.traced") as publish_span:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers)
            await publish(nc, "traced", 3_000, headers)
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
    finally:
        await worker.stop()
    spans = [s for s in exporter.get_finished_spans() if s.name == "hrwcron.worker traced"]
    assert len(spans) == 1
    span, parent = spans[0], publish_span.get_span_context()
    assert span.context.trace_id == parent.trace_id
    assert span.parent is not None and span.parent.span_id == parent.span_id
    assert span.kind == trace.SpanKind.CONSUMER
    assert span.attributes is not None and span.attributes["hrwcron.tick"] == "traced:3000"
    assert [link.context.span_id for link in span.links] == [parent.span_id]


async def test_a_body_that_is_not_a_trigger_is_terminated(nc: Client) -> None:
    calls: list[Any] = []

    async def handler(trigger: Trigger) -> None:
        calls.append(trigger)

    worker = Worker(nc, handler, durable="poison", run_markers=False)
    await worker.start()
    try:
        await nc.jetstream().publish("hrwcron.trigger.poison", b"not json")
        good = await publish(nc, "poison", 4_000)
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        assert worker.stats.poison == 1
        assert [c.tick for c in calls] == [good]
    finally:
        await worker.stop()


def test_worker_refuses_settings_that_cannot_work() -> None:
    async def handler(trigger: Trigger) -> None:
        return None

    client: Any = type("FakeClient", (), {"jetstream": lambda self: None})()
    with pytest.raises(ValueError, match="heartbeat"):
        Worker(client, handler, durable="x", ack_wait=5, heartbeat=5)
    with pytest.raises(ValueError, match="backoff"):
        Worker(client, handler, durable="x", backoff=[])
    with pytest.raises(ValueError, match="concurrency"):
        Worker(client, handler, durable="x", concurrency=0)
    with pytest.raises(ValueError, match="max_deliver"):
        Worker(client, handler, durable="x", max_deliver=0)
    with pytest.raises(ValueError, match="bucket_replicas"):
        Worker(client, handler, durable="x", bucket_replicas=7)
    with pytest.raises(ValueError, match="processed_ttl"):
        Worker(client, handler, durable="x", processed_ttl=0)


async def test_long_run_makes_the_scheduler_skip_overlapping_ticks(nats_url: str) -> None:
    cluster = await Cluster.start(nats_url, {"a": {}, "b": {}})
    release = asyncio.Event()
    runs: list[str] = []

    async def long_job(trigger: Trigger) -> None:
        runs.append(trigger.tick)
        if len(runs) == 1:
            await release.wait()

    worker = Worker(
        cluster.client,
        long_job,
        durable="overlap",
        subjects="hrwcron.trigger.overlap",
        heartbeat=0.5,
        ack_wait=5.0,
    )
    await worker.start()
    try:
        await cluster.admin.put_job(
            JobSpec(name="overlap", schedule="@every 1s", overlap="skip"), 0
        )
        await wait_for_async(lambda: len(runs) == 1, timeout=DEADLINE, message="first run")
        await wait_for_async(
            lambda: cluster.outcomes("overlap", "skipped") >= 2,
            timeout=DEADLINE,
            message="ticks skipped while the first run is still running",
        )
        store = cluster.client.jetstream()
        runs_kv = await store.key_value("hrwcron_runs")
        marker = await runs_kv.get("overlap")
        assert marker.value and msgspec.json.decode(marker.value)["tick"] == runs[0]
        published_while_running = await cluster.ticks("overlap")
        assert published_while_running == [runs[0]]

        release.set()
        await wait_for_async(lambda: len(runs) >= 3, timeout=DEADLINE, message="runs resume")
        keys = await cluster.ticks("overlap")
        dues = scheduled_dues(keys)
        assert len(keys) == len(set(keys))
        # The skipped ticks left a hole in the stream: they were resolved, not published late.
        gaps = [b - a for a, b in itertools.pairwise(dues)]
        assert max(gaps) >= 3000, dues
        assert runs == keys[: len(runs)]
    finally:
        await worker.stop()
        await cluster.stop()
