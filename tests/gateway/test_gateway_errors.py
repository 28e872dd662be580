"""The gateway's errors as OpenAI sends them, and what becomes of the requests it refuses.

The official openai SDK (a dev dependency) is driven against a live server: each gateway error
must come out as the SDK's own exception class with OpenAI's `code`, `type` and `param`, so a
harness's error handling and retry policy treat it as they would OpenAI's. The model server
is the FAKE one of tests/fake_upstream.py.
"""

import asyncio

import openai
import orjson
import pytest
from django.test import AsyncClient

from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.projects.models import Project
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.traces.models import Trace
from tests.fake_upstream import FakeUpstream, free_port

pytestmark = pytest.mark.django_db(transaction=True)  # the recorder writes from its own thread

USER = [{"role": "user", "content": "hello"}]


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
def shop(upstream) -> Project:
    forget_cached_routes()
    project = create_project(slug="shop", upstream_url=upstream.url, served_model="shop-agent")
    project.upstream_model = "base-model"
    project.save()
    return project


@pytest.fixture
def key(shop) -> str:
    return create_api_key(project=shop)[1]


def nothing_recorded() -> bool:
    assert recorder.wait_until_idle(10)
    return not Trace.objects.exists() and not ModelCall.objects.exists()


def post(body: bytes | dict, headers: dict):
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return AsyncClient().post(
        "/v1/chat/completions", content, content_type="application/json", headers=headers
    )


def openai_body(message_part: str, *, param=None, code=None):
    """OpenAI's error object; the message is checked for a telling part only."""
    return {"type": "invalid_request_error", "param": param, "code": code}, message_part


REFUSALS = [
    pytest.param(
        {}, {"model": "shop-agent", "messages": USER}, 401,
        openai_body("You didn't provide an API key"), id="no-key",
    ),
    pytest.param(
        {"Authorization": "Bearer apk_wrong"}, {"model": "shop-agent", "messages": USER}, 401,
        openai_body("Incorrect API key", code="invalid_api_key"), id="wrong-key",
    ),
    pytest.param(
        "KEY", {"model": "gpt-4o", "messages": USER}, 404,
        openai_body("The model `gpt-4o` does not exist", code="model_not_found"),
        id="unknown-model",
    ),
    pytest.param(
        "KEY", b"{nope", 400, openai_body("could not parse the JSON body"), id="not-json",
    ),
    pytest.param(
        "KEY", {"messages": USER}, 400, openai_body("you must provide a model"), id="no-model",
    ),
    pytest.param(
        "KEY", {"model": "shop-agent"}, 400,
        openai_body("Missing required parameter: 'messages'", param="messages",
                    code="missing_required_parameter"),
        id="no-messages",
    ),
    pytest.param(
        "KEY", {"model": "shop-agent", "messages": []}, 400,
        openai_body("empty array", param="messages", code="empty_array"), id="empty-messages",
    ),
    pytest.param(
        "KEY", {"model": "shop-agent", "messages": "hello"}, 400,
        openai_body("expected an array, but got a string", param="messages",
                    code="invalid_type"),
        id="messages-not-a-list",
    ),
    pytest.param(
        "KEY", {"model": "shop-agent", "messages": [{"content": "hello"}]}, 400,
        openai_body("'messages[0].role'", param="messages[0].role",
                    code="missing_required_parameter"),
        id="message-without-role",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("headers", "body", "status", "expected"), REFUSALS)
async def test_a_refusal_has_openais_exact_shape_and_becomes_no_trace(
    upstream, key, headers, body, status, expected
):
    if headers == "KEY":
        headers = {"Authorization": f"Bearer {key}"}
    sent_before = len(upstream.requests)
    response = await post(body, headers)
    assert response.status_code == status
    error = orjson.loads(response.content)["error"]
    fields, message_part = expected
    assert {name: error[name] for name in fields} == fields
    assert set(error) == {"message", "type", "param", "code"}
    assert message_part in error["message"]
    assert len(upstream.requests) == sent_before  # the model server never saw it
    assert await asyncio.to_thread(nothing_recorded)


async def test_a_key_without_the_ingest_scope_is_403_permission_denied(shop):
    _, review_only = await asyncio.to_thread(create_api_key, project=shop, scopes=["review"])
    response = await post(
        {"model": "shop-agent", "messages": USER}, {"Authorization": f"Bearer {review_only}"}
    )
    assert response.status_code == 403
    assert orjson.loads(response.content)["error"]["code"] == "insufficient_scope"


async def test_an_unreachable_model_server_is_a_502_server_error_that_is_recorded(key, shop):
    await Project.objects.filter(pk=shop.pk).aupdate(upstream_url=f"http://127.0.0.1:{free_port()}")
    forget_cached_routes()
    response = await post(
        {"model": "shop-agent", "messages": USER}, {"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 502
    assert orjson.loads(response.content)["error"] == {
        "message": "the model server is unreachable (ConnectError)",
        "type": "server_error",
        "param": None,
        "code": "upstream_unreachable",
    }


async def test_a_body_over_the_size_limit_is_413_in_openais_shape(key, settings):
    settings.INGEST_MAX_BODY_BYTES = 1000
    long = [{"role": "user", "content": "x" * 2000}]
    response = await post(
        {"model": "shop-agent", "messages": long}, {"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 413
    error = orjson.loads(response.content)["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, None)
    assert "1000 bytes" in error["message"]


# The official SDK against a live server


@pytest.fixture
def sdk(live_server, key):
    def client(api_key: str = key) -> openai.OpenAI:
        # No retries: a 5xx would otherwise be sent again, and the test would wait for it.
        return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=api_key, max_retries=0)

    return client


def create(client: openai.OpenAI, **overrides):
    return client.chat.completions.create(**{"model": "shop-agent", "messages": USER, **overrides})


@pytest.mark.parametrize(
    ("call", "exception", "status", "code", "param"),
    [
        pytest.param(
            lambda sdk: create(sdk("apk_wrong")),
            openai.AuthenticationError, 401, "invalid_api_key", None, id="wrong-key",
        ),
        pytest.param(
            lambda sdk: create(sdk(), model="gpt-4o"),
            openai.NotFoundError, 404, "model_not_found", None, id="unknown-model",
        ),
        pytest.param(
            lambda sdk: create(sdk(), messages=[]),
            openai.BadRequestError, 400, "empty_array", "messages", id="empty-messages",
        ),
        pytest.param(
            lambda sdk: create(sdk(), messages=[{"content": "hi"}]),
            openai.BadRequestError, 400, "missing_required_parameter", "messages[0].role",
            id="message-without-role",
        ),
        pytest.param(
            lambda sdk: create(sdk(), stream=True, messages=[]),
            openai.BadRequestError, 400, "empty_array", "messages", id="streamed-bad-body",
        ),
    ],
)  # fmt: skip
def test_the_sdk_raises_its_own_class_for_each_refusal(sdk, call, exception, status, code, param):
    with pytest.raises(exception) as raised:
        call(sdk)
    assert raised.value.status_code == status
    assert raised.value.code == code
    assert raised.value.param == param
    assert raised.value.type == "invalid_request_error"
    assert nothing_recorded()


def test_the_sdk_raises_permission_denied_for_a_key_without_the_ingest_scope(sdk, shop):
    review_only = create_api_key(project=shop, scopes=["review"])[1]
    with pytest.raises(openai.PermissionDeniedError) as raised:
        create(sdk(review_only))
    assert raised.value.code == "insufficient_scope"


def test_the_sdk_raises_internal_server_error_for_a_model_server_failure_and_it_is_a_trace(
    sdk, shop
):
    Project.objects.filter(pk=shop.pk).update(upstream_model="broken-model")
    forget_cached_routes()
    with pytest.raises(openai.InternalServerError) as raised:
        create(sdk())
    assert raised.value.status_code == 500
    assert "model crashed" in str(raised.value)
    assert recorder.wait_until_idle(10)
    [trace] = Trace.objects.all()
    assert trace.termination == "error"
    [call] = ModelCall.objects.all()
    assert call.status_code == 500 and "model crashed" in call.error


def test_the_sdk_raises_internal_server_error_when_the_model_server_is_down(sdk, shop):
    Project.objects.filter(pk=shop.pk).update(upstream_url=f"http://127.0.0.1:{free_port()}")
    forget_cached_routes()
    with pytest.raises(openai.InternalServerError) as raised:
        create(sdk())
    assert raised.value.status_code == 502
    assert raised.value.type == "server_error"


def test_the_sdk_gets_its_answer_when_nothing_is_wrong(sdk):
    completion = create(sdk())
    assert completion.choices[0].message.content
    assert recorder.wait_until_idle(10)
    assert Trace.objects.count() == 1
