"""OTLP/HTTP in both encodings, gzip or not, as the official OpenTelemetry Python SDK sends it."""

import gzip
import json

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from reviewapp.traces.models import Trace

URL = "/api/v1/otel/v1/traces"
PROTOBUF = "application/x-protobuf"


def sdk_chat_spans():
    """One GenAI chat span recorded by the SDK, as its OTLP exporters receive it."""
    exporter = InMemorySpanExporter()
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
                        "parts": [{"type": "text", "content": "Paris."}],
                        "finish_reason": "stop",
                    }
                ]
            ),
        )
        span.set_attribute("gen_ai.usage.input_tokens", 12)
        span.set_attribute("gen_ai.usage.output_tokens", 3)
    provider.shutdown()
    return exporter.get_finished_spans()


def trace_id_of(spans) -> str:
    return format(spans[0].context.trace_id, "032x")


def post(api, body: bytes, content_type: str, **headers):
    return api.client.post(URL, body, content_type=content_type, headers={**api.headers, **headers})


def assert_stored_as_sent(api, trace_id: str):
    stored = api.get(f"/api/v1/traces/{trace_id}").json()
    assert stored["source"] == "otel"
    assert stored["messages"] == [
        {"role": "user", "content": "Capital?"},
        {"role": "assistant", "content": "Paris."},
    ]
    assert stored["usage"] == {"prompt_tokens": 12, "completion_tokens": 3}


def test_protobuf_export_from_the_sdk_encoder_is_stored(api, project):
    spans = sdk_chat_spans()
    response = post(api, encode_spans(spans).SerializeToString(), PROTOBUF)
    assert response.status_code == 207
    assert response.json()["results"] == [{"external_id": trace_id_of(spans), "status": 201}]
    assert_stored_as_sent(api, trace_id_of(spans))
    assert Trace.objects.get(project=project).model == "SmolLM2-135M-Instruct"


def test_gzipped_protobuf_export_is_stored(api):
    spans = sdk_chat_spans()
    body = gzip.compress(encode_spans(spans).SerializeToString())
    response = post(api, body, PROTOBUF, **{"Content-Encoding": "gzip"})
    assert response.status_code == 207
    assert response.json()["results"][0]["status"] == 201
    assert_stored_as_sent(api, trace_id_of(spans))


def test_gzipped_json_export_is_stored(api):
    spans = sdk_chat_spans()
    body = gzip.compress(json_format.MessageToJson(encode_spans(spans)).encode())
    response = post(api, body, "application/json", **{"Content-Encoding": "gzip"})
    assert response.status_code == 207
    assert_stored_as_sent(api, trace_id_of(spans))


def test_protobuf_and_json_of_one_export_are_the_same_trace(api, project):
    request = encode_spans(sdk_chat_spans())
    assert post(api, request.SerializeToString(), PROTOBUF).json()["results"][0]["status"] == 201
    again = post(api, json_format.MessageToJson(request).encode(), "application/json")
    # 200 is "an unchanged duplicate": the same external id with the same content
    assert again.json()["results"][0]["status"] == 200
    assert Trace.objects.filter(project=project).count() == 1


def test_a_body_that_is_not_gzip_is_400_naming_gzip(api, project):
    response = post(api, b"\x0a\x0b not gzip", PROTOBUF, **{"Content-Encoding": "gzip"})
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_gzip"
    assert "gzip" in response.json()["detail"]
    assert not Trace.objects.exists()


@pytest.mark.parametrize("content_type", [PROTOBUF, "application/json"])
def test_a_gzip_body_that_inflates_past_the_limit_is_413(api, settings, content_type):
    settings.INGEST_MAX_BODY_BYTES = 10_000
    body = gzip.compress(b" " * 50_000)  # 50 kB of spaces: a few dozen bytes compressed
    response = post(api, body, content_type, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413


def test_an_unknown_content_encoding_is_415(api):
    response = post(api, b"{}", "application/json", **{"Content-Encoding": "br"})
    assert response.status_code == 415
    assert "gzip" in response.json()["detail"]


def test_bytes_that_are_not_an_otlp_protobuf_are_400(api, project):
    response = post(api, b"\x0a\x0b", PROTOBUF)
    assert response.status_code == 400
    assert "protobuf" in response.json()["detail"]
    assert not Trace.objects.exists()


def test_other_content_types_are_415_naming_the_accepted_ones(api):
    response = post(api, b"resourceSpans", "text/plain")
    assert response.status_code == 415
    detail = response.json()["detail"]
    assert PROTOBUF in detail
    assert "application/json" in detail
