"""Tracing for the replica: the OpenTelemetry span behind the engine's ``TickSpan`` (its
``traceparent`` rides in the trigger headers) and the tracer provider set up by OTEL_* variables."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hrwcron.core.outcomes import Outcome
from hrwcron.engine.ports import TickSpan

log = logging.getLogger("hrwcron.telemetry")

_PROPAGATOR = TraceContextTextMapPropagator()


class OtelTickSpan:
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
        elif key == "outcome" and value == Outcome.STARTED:
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
        return OtelTickSpan(span, self._tracer, self._due_ms, self._now_ms, self._claims_bucket)

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
