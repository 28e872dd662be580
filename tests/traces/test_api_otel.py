import json

from reviewapp.traces.models import Trace
from tests.factories import ApiClient
from tests.traces.test_otel import TRACE_ID, make_request, make_span

URL = "/api/v1/otel/v1/traces"


def chat_span(**overrides):
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "SmolLM2-135M-Instruct",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [
                {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": "Paris."}],
                    "finish_reason": "stop",
                }
            ]
        ),
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
    }
    attributes.update(overrides)
    return make_span(attributes)


def test_otlp_spans_become_one_trace_named_by_the_trace_id(api, project):
    response = api.post(URL, make_request(chat_span()))
    assert response.status_code == 207
    assert response.json()["results"] == [{"external_id": TRACE_ID, "status": 201}]
    stored = api.get(f"/api/v1/traces/{TRACE_ID}").json()
    assert stored["source"] == "otel"
    assert stored["messages"] == [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    assert stored["usage"] == {"prompt_tokens": 12, "completion_tokens": 3}
    assert Trace.objects.get(project=project).model == "SmolLM2-135M-Instruct"


def test_resending_the_same_spans_stores_nothing_twice(api, project):
    api.post(URL, make_request(chat_span()))
    again = api.post(URL, make_request(chat_span()))
    assert again.json()["results"][0]["status"] == 200
    assert Trace.objects.filter(project=project).count() == 1


def test_malformed_otlp_is_422_naming_the_field(api, project):
    request = make_request(chat_span())
    request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "xyz"
    response = api.post(URL, request)
    assert response.status_code == 422
    assert "spans[0].traceId" in response.json()["detail"]
    assert not Trace.objects.exists()


def test_otlp_json_that_is_not_json_is_400(api):
    response = api.post(URL, body=b"\x0a\x0b")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_json"


def test_otlp_needs_a_key(project):
    assert ApiClient(None).post(URL, make_request(chat_span())).status_code == 401
