"""The official OpenTelemetry Python OTLP/HTTP exporter (opentelemetry-exporter-otlp-proto-http,
a dev dependency) sending spans to a live server, as a harness configured with it does:
binary protobuf, gzip-compressed or not. Its spans must be stored, not answered 415 and lost."""

import json

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanKind

from reviewapp.traces.models import Trace

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what tests write


class RecordingExporter(OTLPSpanExporter):
    """The official exporter, keeping what each export returned (the SDK drops it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.results: list[SpanExportResult] = []

    def export(self, spans):
        result = super().export(spans)
        self.results.append(result)
        return result


def export_one_chat(exporter: OTLPSpanExporter, answer: str) -> str:
    """Record one GenAI chat span through the SDK and export it; returns its trace id (hex)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("support-bot")
    with tracer.start_as_current_span("chat SmolLM2-135M-Instruct", kind=SpanKind.CLIENT) as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", "SmolLM2-135M-Instruct")
        span.set_attribute(
            "gen_ai.input.messages",
            json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Capital?"}]}]),
        )
        span.set_attribute(
            "gen_ai.output.messages",
            json.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": answer}],
                        "finish_reason": "stop",
                    }
                ]
            ),
        )
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


@pytest.mark.parametrize(
    "compression", [Compression.NoCompression, Compression.Gzip], ids=["plain", "gzip"]
)
def test_the_official_exporter_stores_its_spans(live_server, project, api_key, compression):
    exporter = RecordingExporter(
        endpoint=f"{live_server.url}/api/v1/otel/v1/traces",
        headers={"Authorization": f"Bearer {api_key}"},
        compression=compression,
        timeout=30,
    )
    trace_id = export_one_chat(exporter, "Paris.")
    assert exporter.results == [SpanExportResult.SUCCESS]
    trace = Trace.objects.get(project=project, external_id=trace_id)
    assert trace.source == "otel"
    assert trace.body_json()["messages"] == [
        {"role": "user", "content": "Capital?"},
        {"role": "assistant", "content": "Paris."},
    ]


def test_the_exporter_reports_failure_for_a_wrong_key(live_server, project):
    exporter = RecordingExporter(
        endpoint=f"{live_server.url}/api/v1/otel/v1/traces",
        headers={"Authorization": "Bearer apk_wrong"},
        timeout=30,
    )
    export_one_chat(exporter, "Paris.")
    assert exporter.results == [SpanExportResult.FAILURE]
    assert not Trace.objects.exists()
