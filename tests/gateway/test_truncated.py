"""A reply cut at max_tokens makes its trace `truncated`: gateway (plain and streamed), OTel
ingest, and the list filter and monitors that count it like timeouts."""

import asyncio
import json

import orjson
import pytest
from django.test import AsyncClient, Client

from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace
from reviewapp.traces.otel import traces_from_otlp
from tests.factories import make_trace
from tests.fake_upstream import FakeUpstream
from tests.traces.test_otel import make_request, make_span

LONG_QUESTION = [{"role": "user", "content": "tell me about the weather in Oslo today"}]


@pytest.fixture(scope="module")
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def gateway_key(upstream, transactional_db):
    forget_cached_routes()
    project = create_project(slug="shop", upstream_url=upstream.url, served_model="shop-agent")
    yield create_api_key(project=project)[1]
    assert recorder.wait_until_idle(15), "a recording leaked past its test"


async def chat(key: str, messages, **extra) -> bytes:
    body = {"model": "shop-agent", "messages": messages, **extra}
    response = await AsyncClient().post(
        "/v1/chat/completions",
        orjson.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}", "X-Trace-Id": "episode-1"},
    )
    content = (
        b"".join([chunk async for chunk in response.streaming_content])
        if extra.get("stream")
        else response.content
    )
    assert await asyncio.to_thread(recorder.wait_until_idle, 10)
    return content


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_cut_at_max_tokens_makes_the_trace_truncated(gateway_key, stream):
    await chat(gateway_key, LONG_QUESTION, max_tokens=3, stream=stream)
    call = await ModelCall.objects.aget()
    assert (call.finish_reason, call.termination) == ("length", "truncated")
    assert (await Trace.objects.aget()).termination == "truncated"


async def test_a_reply_within_max_tokens_is_completed(gateway_key):
    await chat(gateway_key, LONG_QUESTION, max_tokens=100)
    assert (await Trace.objects.aget()).termination == "completed"


async def test_a_later_completed_call_does_not_hide_the_truncation(gateway_key):
    answer = orjson.loads(await chat(gateway_key, LONG_QUESTION, max_tokens=3))
    follow_up = [
        *LONG_QUESTION,
        answer["choices"][0]["message"],
        {"role": "user", "content": "go on"},
    ]
    await chat(gateway_key, follow_up)
    trace = await Trace.objects.aget()
    assert await trace.calls.acount() == 2
    assert trace.termination == "truncated"


def otel_chat_span(finish_reasons):
    return make_span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "Tell me more"}]}]
            ),
            "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "Well, the"}]}]
            ),
            "gen_ai.response.finish_reasons": finish_reasons,
        }
    )


def test_an_otel_reply_cut_at_max_tokens_is_truncated():
    [trace] = traces_from_otlp(make_request(otel_chat_span(["length"])))
    assert trace["termination"] == "truncated"
    [trace] = traces_from_otlp(make_request(otel_chat_span(["stop"])))
    assert trace["termination"] == "completed"


def test_the_trace_list_filters_truncated_traces(bob, project):
    ingest_traces(
        project=project,
        raw_items=[make_trace("cut-short", termination="truncated"), make_trace("whole")],
    )
    client = Client()
    client.force_login(bob)
    html = client.get("/p/acme/traces/?termination=truncated").content.decode()
    assert "cut-short" in html
    assert "whole" not in html


def test_the_monitors_count_truncated_traces_with_a_link_to_them(victor, project):
    ingest_traces(
        project=project,
        raw_items=[
            make_trace(f"t-{i}", model="agent-1", termination="truncated" if i < 2 else "completed")
            for i in range(8)
        ],
    )
    client = Client()
    client.force_login(victor)
    html = client.get("/p/acme/monitors/").content.decode()
    assert "Cut at max_tokens" in html
    assert (
        '<a href="/p/acme/traces/?adapter=base&amp;model=agent-1&amp;termination=truncated">'
        "25.0%</a>" in html
    )
