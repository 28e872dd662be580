"""The recording gateway against a FAKE upstream (tests/fake_upstream.py); slow tests use vLLM."""

import asyncio
import contextlib
import time

import orjson
import pytest
from django.test import AsyncClient

from reviewapp.gateway import recorder as recorder_module
from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.learning.models import ModelRoute
from reviewapp.projects.models import Project
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.traces.models import Trace
from tests.fake_upstream import FakeUpstream, free_port

pytestmark = pytest.mark.django_db(transaction=True)  # the recorder writes from its own thread


@pytest.fixture(autouse=True)
def recorder_is_idle_after_each_test():
    yield
    assert recorder.wait_until_idle(15), "a recording leaked past its test"


@pytest.fixture(scope="module")
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def gateway_key(upstream):
    forget_cached_routes()
    project = create_project(slug="shop", upstream_url=upstream.url, served_model="shop-agent")
    project.upstream_model = "base-model"
    project.save()
    return create_api_key(project=project)[1]


def chat(key: str, messages, *, stream=False, model="shop-agent", trace_id=None, **extra):
    headers = {"Authorization": f"Bearer {key}"}
    if trace_id:
        headers["X-Trace-Id"] = trace_id
    body = {"model": model, "messages": messages, "stream": stream, **extra}
    return AsyncClient().post(
        "/v1/chat/completions", orjson.dumps(body), content_type="application/json", headers=headers
    )


async def serve_base_as(name: str) -> None:
    """The fake upstream behaves by model name; the gateway forwards only the project's names."""
    await Project.objects.filter(slug="shop").aupdate(upstream_model=name)
    forget_cached_routes()


async def read_stream(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


def recorded() -> list[ModelCall]:
    assert recorder.wait_until_idle(10)
    return list(ModelCall.objects.order_by("id"))


USER = [{"role": "user", "content": "hello"}]


async def test_a_call_passes_through_unchanged_and_is_recorded(upstream, gateway_key):
    response = await chat(gateway_key, USER)
    assert response.status_code == 200
    body = orjson.loads(response.content)
    assert body["choices"][0]["message"]["content"] == "echo: hello"
    assert upstream.requests[-1]["body"]["model"] == "base-model"  # the alias was routed
    [call] = await asyncio.to_thread(recorded)
    assert (call.status_code, call.termination, call.stream) == (200, "completed", False)
    assert (call.prompt_tokens, call.completion_tokens, call.finish_reason) == (7, 3, "stop")
    assert ModelCall.unpack(call.response) == body


async def test_no_credential_is_stored_or_forwarded(upstream, gateway_key):
    await chat(gateway_key, USER)
    [call] = await asyncio.to_thread(recorded)
    assert gateway_key not in ModelCall.unpack(call.request).__repr__()
    assert gateway_key.encode() not in bytes(call.request)
    assert "authorization" not in upstream.requests[-1]["headers"]


async def test_a_streamed_call_passes_through_and_is_reassembled(upstream, gateway_key):
    response = await chat(gateway_key, USER, stream=True)
    raw = await read_stream(response)
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b'"content":"echo"' in raw
    [call] = await asyncio.to_thread(recorded)
    assert call.stream and call.termination == "completed"
    assert call.time_to_first_token_ms is not None
    message = ModelCall.unpack(call.response)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "echo: hello"}


async def test_calls_extending_a_conversation_join_its_trace(upstream, gateway_key):
    await chat(gateway_key, USER)
    answer = {"role": "assistant", "content": "echo: hello"}
    await chat(gateway_key, [*USER, answer, {"role": "user", "content": "again"}])
    await asyncio.to_thread(recorded)
    trace = await Trace.objects.aget()
    messages = (await asyncio.to_thread(trace.body_json))["messages"]
    assert [m["content"] for m in messages] == ["hello", "echo: hello", "again", "echo: again"]
    turns = [c.turn_index async for c in ModelCall.objects.order_by("id")]
    assert turns == [1, 3]


async def test_a_different_conversation_starts_a_new_trace(upstream, gateway_key):
    await chat(gateway_key, USER)
    await chat(gateway_key, [{"role": "user", "content": "unrelated"}])
    await asyncio.to_thread(recorded)
    assert await Trace.objects.acount() == 2


async def test_x_trace_id_groups_calls_into_one_trace(upstream, gateway_key):
    await chat(gateway_key, USER, trace_id="episode-7")
    await chat(gateway_key, [{"role": "user", "content": "second agent"}], trace_id="episode-7")
    await asyncio.to_thread(recorded)
    trace = await Trace.objects.aget()
    assert trace.external_id == "episode-7" and trace.source == "gateway"
    contents = [m["content"] for m in (await asyncio.to_thread(trace.body_json))["messages"]]
    assert contents == ["hello", "echo: hello", "second agent", "echo: second agent"]


async def test_an_upstream_that_is_down_gives_502_and_a_recorded_failure(gateway_key):
    await Trace.objects.all().adelete()
    project_upstream = f"http://127.0.0.1:{free_port()}/v1"
    from reviewapp.projects.models import Project

    await Project.objects.filter(slug="shop").aupdate(upstream_url=project_upstream)
    forget_cached_routes()
    response = await chat(gateway_key, USER)
    assert response.status_code == 502
    error = orjson.loads(response.content)["error"]
    assert (error["type"], error["code"]) == ("server_error", "upstream_unreachable")
    [call] = await asyncio.to_thread(recorded)
    assert (call.status_code, call.termination) == (502, "error")
    assert (await Trace.objects.aget()).termination == "error"


async def test_an_upstream_timeout_gives_504_and_is_recorded(upstream, gateway_key, settings):
    settings.GATEWAY_READ_TIMEOUT = 0.5
    from reviewapp.gateway import views

    views._clients.clear()
    await serve_base_as("slow-model")
    response = await chat(gateway_key, USER, model="slow-model")
    views._clients.clear()
    assert response.status_code == 504
    [call] = await asyncio.to_thread(recorded)
    assert call.termination == "timeout"


async def test_an_upstream_error_passes_through_and_is_recorded(upstream, gateway_key):
    await serve_base_as("broken-model")
    response = await chat(gateway_key, USER, model="broken-model")
    assert response.status_code == 500
    assert orjson.loads(response.content)["error"]["message"] == "model crashed"
    [call] = await asyncio.to_thread(recorded)
    assert (call.status_code, call.termination) == (500, "error")


async def test_a_client_that_disconnects_mid_stream_is_recorded_as_such(upstream, gateway_key):
    await serve_base_as("drip-model")
    response = await chat(gateway_key, USER, stream=True, model="drip-model")
    # What Django's ASGI handler does when the client goes away: stop reading, close.
    async with contextlib.aclosing(aiter(response)) as content:
        async for _ in content:
            break
    deadline = time.monotonic() + 10
    while not await ModelCall.objects.aexists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the stream's cleanup runs as the generators are finalised
    [call] = await asyncio.to_thread(recorded)
    assert call.termination == "client_disconnected"


async def test_a_slow_database_does_not_slow_the_harness(upstream, gateway_key, monkeypatch):
    real = recorder_module.record_model_calls

    def slow_record(batch, **kwargs):
        time.sleep(2)
        return real(batch, **kwargs)

    # The recorder thread writes batches through the name it imported.
    monkeypatch.setattr(recorder_module, "record_model_calls", slow_record)
    started = time.perf_counter()
    response = await chat(gateway_key, USER)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200
    assert elapsed < 1.0
    assert await ModelCall.objects.acount() == 0  # not yet written when the harness had it
    assert len(await asyncio.to_thread(recorded)) == 1


async def test_the_canary_share_routes_that_fraction_to_the_adapter(upstream, gateway_key):
    from reviewapp.projects.models import Project

    project = await Project.objects.aget(slug="shop")
    await ModelRoute.objects.acreate(project=project, canary="shop-v1", canary_share=100)
    forget_cached_routes()
    await chat(gateway_key, USER)
    assert upstream.requests[-1]["body"]["model"] == "shop-v1"
    [call] = await asyncio.to_thread(recorded)
    assert call.adapter_version == "shop-v1"
    assert (await Trace.objects.aget()).adapter_version == "shop-v1"


def test_routing_splits_traffic_by_share():
    import random

    from reviewapp.gateway.routing import GatewayProject, destination_for

    project = GatewayProject(1, "p", "alias", "http://u", "base", "v1", "v2", 25)
    rng = random.Random(0)
    picks = [destination_for(project, "alias", rng).upstream_model for _ in range(4000)]
    assert 0.22 < picks.count("v2") / 4000 < 0.28
    assert set(picks) == {"v1", "v2"}
    assert destination_for(project, "other-model", rng) is None


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({}, {"model": "shop-agent", "messages": USER}, 401),
        ({"Authorization": "Bearer nope"}, {"model": "shop-agent", "messages": USER}, 401),
    ],
)
async def test_the_gateway_needs_a_project_key(gateway_key, headers, body, status):
    response = await AsyncClient().post(
        "/v1/chat/completions", orjson.dumps(body), content_type="application/json", headers=headers
    )
    assert response.status_code == status
    assert "error" in orjson.loads(response.content)


async def test_a_body_that_is_not_json_is_400(gateway_key):
    response = await AsyncClient().post(
        "/v1/chat/completions",
        b"{nope",
        content_type="application/json",
        headers={"Authorization": f"Bearer {gateway_key}"},
    )
    assert response.status_code == 400


async def test_models_lists_the_alias(gateway_key):
    response = await AsyncClient().get(
        "/v1/models", headers={"Authorization": f"Bearer {gateway_key}"}
    )
    assert [m["id"] for m in orjson.loads(response.content)["data"]] == ["shop-agent"]
