"""A harness instrumented the standard way, calling the model through the gateway: the openai SDK
under OpenTelemetry's openai-v2 instrumentation (its GenAI chat span), its httpx client under the
httpx instrumentation (which sends W3C traceparent), spans exported by the official OTLP/HTTP
exporter. The gateway and the exporter both deliver the call: one trace, not two."""

import httpx
import openai
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.traces.models import Trace
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what tests write


class RecordingExporter(OTLPSpanExporter):
    """The official exporter, keeping the spans it sent and what each export returned."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sent, self.results = [], []

    def export(self, spans):
        result = super().export(spans)
        self.sent.extend(spans)
        self.results.append(result)
        return result


@pytest.fixture(scope="module")
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def instrumented(monkeypatch):
    """The harness's tracer provider, with the openai SDK instrumented (message content on)."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    provider = TracerProvider()
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield provider
    instrumentor.uninstrument()
    provider.shutdown()


def test_an_instrumented_openai_call_through_the_gateway_is_one_trace(
    live_server, upstream, instrumented
):
    forget_cached_routes()
    project = create_project(slug="shop", upstream_url=upstream.url, served_model="shop-agent")
    key = create_api_key(project=project)[1]
    exporter = RecordingExporter(
        endpoint=f"{live_server.url}/api/v1/otel/v1/traces",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    instrumented.add_span_processor(SimpleSpanProcessor(exporter))
    http_client = httpx.Client()
    HTTPXClientInstrumentor.instrument_client(http_client, tracer_provider=instrumented)
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=key, http_client=http_client)

    reply = client.chat.completions.create(
        model="shop-agent", messages=[{"role": "user", "content": "hello"}]
    )
    instrumented.force_flush()
    assert recorder.wait_until_idle(15)

    assert reply.choices[0].message.content == "echo: hello"
    chat_span = next(span for span in exporter.sent if span.name == "chat shop-agent")
    assert set(exporter.results) == {SpanExportResult.SUCCESS}
    [trace] = Trace.objects.filter(project=project)
    assert trace.external_id == format(chat_span.context.trace_id, "032x")
    assert trace.source == "gateway"  # the richer record: the call as the model server saw it
    assert trace.body_json()["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "echo: hello"},
    ]
