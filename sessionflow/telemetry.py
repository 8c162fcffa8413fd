"""OpenTelemetry: one tracer for sessionflow's own spans and the Temporal tracing interceptor.

The exporter comes from settings (``SESSIONFLOW_OTEL_EXPORTER``): ``none`` (the default; spans
cost almost nothing), ``console``, or ``otlp`` when ``opentelemetry-exporter-otlp`` is
installed. With the interceptor on the client, a prompt's signal, the drain workflow, its
activities and our spans inside them (provider turns, tool runs, store appends) form one trace.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from temporalio.contrib.opentelemetry import TracingInterceptor


def configure(exporter: str) -> None:
    """Set up the process's tracer provider from the settings' exporter name, at the edge."""
    if exporter == "none":
        return
    provider = TracerProvider()
    provider.add_span_processor(_processor(exporter))
    trace.set_tracer_provider(provider)


def _processor(exporter: str) -> Any:
    if exporter == "console":
        return SimpleSpanProcessor(ConsoleSpanExporter())
    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as error:
            raise ValueError(
                "SESSIONFLOW_OTEL_EXPORTER=otlp needs the exporter package: "
                "pip install opentelemetry-exporter-otlp"
            ) from error
        otlp: SpanExporter = OTLPSpanExporter()
        return BatchSpanProcessor(otlp)
    raise ValueError(f"Unknown OpenTelemetry exporter {exporter!r}: use none, console or otlp")


def tracer() -> trace.Tracer:
    # A proxy until a provider is configured: spans cost next to nothing with none.
    return trace.get_tracer("sessionflow")


def interceptors() -> list[Any]:
    """The Temporal client interceptors (workers built from the client inherit them)."""
    return [TracingInterceptor(tracer())]
