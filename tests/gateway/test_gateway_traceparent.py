"""One trace per episode: a gateway call carrying W3C traceparent joins the harness's OTel trace."""

import asyncio
import json

import orjson
import pytest
from django.test import AsyncClient

from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.gateway.tracecontext import trace_id_from_traceparent
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.traces.models import Trace
from tests.fake_upstream import FakeUpstream
from tests.traces.test_otel import make_request, make_span

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def key(upstream, transactional_db):
    """The harness's key: it calls the gateway and exports its spans with the same one."""
    forget_cached_routes()
    project = create_project(slug="shop", upstream_url=upstream.url, served_model="shop-agent")
    yield create_api_key(project=project)[1]
    assert recorder.wait_until_idle(15), "a recording leaked past its test"


async def chat(key: str, **headers):
    body = {"model": "shop-agent", "messages": HELLO}
    response = await AsyncClient().post(
        "/v1/chat/completions",
        orjson.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}", **headers},
    )
    assert response.status_code == 200
    assert await asyncio.to_thread(recorder.wait_until_idle, 10)


async def export_spans(key: str) -> dict:
    """The OTel chat span the harness's instrumentation records for the same call."""
    messages = [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}]
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": "echo: hello"}]}]
    span = make_span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "shop-agent",
            "gen_ai.input.messages": json.dumps(messages),
            "gen_ai.output.messages": json.dumps(answer),
        },
        trace_id=TRACE_ID,
    )
    response = await AsyncClient().post(
        "/api/v1/otel/v1/traces",
        json.dumps(make_request(span)),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 207
    return response.json()["results"][0]


async def test_a_call_with_traceparent_is_recorded_under_its_trace_id(key):
    await chat(key, traceparent=TRACEPARENT)
    assert [t.external_id async for t in Trace.objects.all()] == [TRACE_ID]


async def test_otel_spans_then_the_gateway_call_are_one_trace(key):
    assert (await export_spans(key))["status"] == 201
    await chat(key, traceparent=TRACEPARENT)
    trace = await Trace.objects.aget()
    assert trace.external_id == TRACE_ID
    messages = (await asyncio.to_thread(trace.body_json))["messages"]
    assert [m["content"] for m in messages] == ["hello", "echo: hello"]
    assert await trace.calls.acount() == 1


async def test_the_gateway_call_then_otel_spans_are_one_trace(key):
    await chat(key, traceparent=TRACEPARENT)
    result = await export_spans(key)
    assert result["status"] == 200
    assert "gateway" in result["warnings"][0]
    trace = await Trace.objects.aget()
    assert (trace.external_id, trace.source) == (TRACE_ID, "gateway")


async def test_x_trace_id_wins_over_traceparent(key):
    await chat(key, traceparent=TRACEPARENT, **{"X-Trace-Id": "episode-7"})
    assert [t.external_id async for t in Trace.objects.all()] == ["episode-7"]


@pytest.mark.parametrize(
    "header",
    [
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # version ff is invalid
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",  # uppercase hex
        f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra",  # version 00 has exactly four fields
        "not a traceparent",
    ],
)
def test_an_invalid_traceparent_is_ignored(header):
    assert trace_id_from_traceparent(header) is None


def test_a_future_traceparent_version_is_read():
    assert trace_id_from_traceparent(f"01-{TRACE_ID}-00f067aa0ba902b7-01-more") == TRACE_ID


async def test_a_call_with_an_invalid_traceparent_starts_its_own_trace(key):
    await chat(key, traceparent=f"00-{'0' * 32}-00f067aa0ba902b7-01")
    trace = await Trace.objects.aget()
    assert trace.external_id.startswith("gw-")
