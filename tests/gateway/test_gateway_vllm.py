"""The recording gateway in front of a real vLLM CPU server with the bundled model."""

import asyncio

import orjson
import pytest
from django.test import AsyncClient

from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.traces.models import Trace

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def key(vllm_url):
    forget_cached_routes()
    project = create_project(slug="live", upstream_url=vllm_url, served_model=MODEL)
    return create_api_key(project=project)[1]


def chat(key, messages, *, trace_id=None, **extra):
    headers = {"Authorization": f"Bearer {key}"}
    if trace_id:
        headers["X-Trace-Id"] = trace_id
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, **extra}
    return AsyncClient().post(
        "/v1/chat/completions", orjson.dumps(body), content_type="application/json", headers=headers
    )


def calls() -> list[ModelCall]:
    assert recorder.wait_until_idle(30)
    return list(ModelCall.objects.order_by("id"))


async def test_a_real_completion_passes_through_and_is_recorded_with_token_ids(key):
    response = await chat(key, QUESTION, return_token_ids=True)
    assert response.status_code == 200
    body = orjson.loads(response.content)
    assert "Paris" in body["choices"][0]["message"]["content"]
    [call] = await asyncio.to_thread(calls)
    assert call.termination == "completed" and call.has_token_ids
    assert ModelCall.unpack(call.response) == body
    assert key.encode() not in bytes(call.request)


async def test_a_real_stream_passes_through_and_is_reassembled(key):
    response = await chat(key, QUESTION, stream=True)
    raw = b"".join([chunk async for chunk in response])
    assert raw.rstrip().endswith(b"data: [DONE]")
    streamed = "".join(
        (orjson.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in raw.split(b"\n")
        if line.startswith(b"data: {")
    )
    [call] = await asyncio.to_thread(calls)
    assert call.stream and call.termination == "completed"
    assert ModelCall.unpack(call.response)["choices"][0]["message"]["content"] == streamed
    assert "Paris" in streamed


async def test_real_calls_group_into_traces_by_prefix_and_by_header(key):
    first = orjson.loads((await chat(key, QUESTION)).content)["choices"][0]["message"]
    follow_up = [*QUESTION, first, {"role": "user", "content": "And of Italy?"}]
    await chat(key, follow_up)
    await chat(key, QUESTION, trace_id="run-1")
    await chat(key, [{"role": "user", "content": "Name a colour."}], trace_id="run-1")
    await asyncio.to_thread(calls)
    merged = await Trace.objects.exclude(external_id="run-1").aget()
    assert merged.message_count == 4
    assert (await Trace.objects.aget(external_id="run-1")).message_count == 4


async def test_tool_calls_from_vllm_are_recorded_as_the_trace_turn(key):
    tool = {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
    response = await chat(
        key,
        [{"role": "user", "content": "What is 17 * 23?"}],
        tools=[tool],
        tool_choice="required",
        max_tokens=80,
    )
    assert response.status_code == 200
    await asyncio.to_thread(calls)
    trace = await Trace.objects.aget()
    messages = (await asyncio.to_thread(trace.body_json))["messages"]
    assert messages[-1]["tool_calls"][0]["function"]["name"] == "calculator"
    assert trace.tool_call_count == 1
