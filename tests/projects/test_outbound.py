"""What a project's settings can reach: only the operator's model servers, teacher endpoints and
declared keys (reviewapp/projects/outbound.py). Each test replays an attack first: a project
admin's key names a listener on 127.0.0.1, or an environment variable, and nothing reaches the
listener.

The model servers here are FAKE (tests/fake_upstream.py over real HTTP on 127.0.0.1); the
listener records every request it gets.
"""

import importlib

import httpx
import orjson
import pytest
from django.test import Client

from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.learning.models import DistillationTarget
from reviewapp.learning.proposals import propose_targets_for
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import settings_for, update_settings
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import FeedbackStatus
from reviewapp.traces.ingest import ingest_traces
from tests.factories import ApiClient, make_trace
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)  # the gateway's recorder has its own thread

CHAT = {"model": "shop-agent", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def own_server():
    """The operator's model server: the project's upstream, in MODEL_SERVERS."""
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def listener():
    """An address of the attacker's choosing on this machine."""
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def deployment(settings, own_server, listener):
    settings.MODEL_SERVERS = [own_server.url]
    settings.TEACHER_SERVERS = []
    settings.TEACHER_API_KEYS = {}
    settings.VLLM_API_KEY = "operator-vllm-key"
    own_server.requests.clear()
    listener.requests.clear()
    forget_cached_routes()
    yield
    assert recorder.wait_until_idle(15)


@pytest.fixture
def shop(own_server):
    return create_project(slug="shop", upstream_url=own_server.url, served_model="shop-agent")


@pytest.fixture
def shop_admin(shop) -> ApiClient:
    """An admin-scoped key, as any member with the admin role can mint on the Keys page."""
    return ApiClient(create_api_key(project=shop, scopes=["ingest", "review", "admin"])[1])


@pytest.fixture
def harness_key(shop) -> str:
    return create_api_key(project=shop)[1]


@pytest.fixture
def feedback(shop):
    ingest_traces(project=shop, raw_items=[make_trace("t-1")])
    created, _ = record_feedback(trace=shop.traces.get(), text="Lead with the number.", turn=4)
    return created


def gateway_call(key: str):
    return Client().post(
        "/v1/chat/completions",
        orjson.dumps(CHAT),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def sent_to(server: FakeUpstream) -> str:
    """Everything a server received, headers and bodies, as one text to search."""
    return orjson.dumps(server.requests).decode()


# -- the teacher endpoint ----------------------------------------------------------------------


def test_a_teacher_url_the_operator_does_not_offer_is_refused_and_never_called(
    shop, shop_admin, listener, feedback
):
    response = shop_admin.patch("/api/v1/settings", {"teacher": {"url": listener.url}})

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "teacher.url" in detail and "TEACHER_SERVERS" in detail
    assert Project.objects.get(pk=shop.pk).settings == {}
    propose_targets_for(feedback_id=feedback.pk)  # the project's own server teaches instead
    assert listener.requests == []


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/v1",
        "http://user:pw@127.0.0.1/v1",
        "http://[::1",
    ],
)
def test_a_teacher_url_that_is_not_a_plain_http_base_url_is_refused(shop_admin, url):
    response = shop_admin.patch("/api/v1/settings", {"teacher": {"url": url}})

    assert response.status_code == 422
    assert "teacher.url" in response.json()["detail"]


def test_an_environment_variable_cannot_be_named_as_the_teachers_key(
    shop, shop_admin, listener, settings, monkeypatch
):
    monkeypatch.setenv("APPRENTICE_TEST_SERVER_SECRET", "server-secret-value")
    settings.TEACHER_SERVERS = [listener.url]
    settings.TEACHER_API_KEYS = {"frontier": "APPRENTICE_TEST_TEACHER_KEY"}

    by_variable = {"url": listener.url, "api_key_env": "APPRENTICE_TEST_SERVER_SECRET"}
    by_name = {"url": listener.url, "key_name": "APPRENTICE_TEST_SERVER_SECRET"}
    refused_variable = shop_admin.patch("/api/v1/settings", {"teacher": by_variable})
    refused_name = shop_admin.patch("/api/v1/settings", {"teacher": by_name})

    assert refused_variable.status_code == 422
    assert "teacher.api_key_env" in refused_variable.json()["detail"]
    assert refused_name.status_code == 422
    assert "declared: frontier" in refused_name.json()["detail"]
    assert "server-secret-value" not in refused_name.content.decode()
    assert Project.objects.get(pk=shop.pk).settings == {}


def test_a_declared_key_goes_to_the_offered_teacher_and_no_other_secret_leaves(
    shop, shop_admin, listener, feedback, settings, monkeypatch
):
    monkeypatch.setenv("APPRENTICE_TEST_TEACHER_KEY", "declared-teacher-key")
    monkeypatch.setenv("APPRENTICE_TEST_SERVER_SECRET", "server-secret-value")
    settings.TEACHER_SERVERS = [listener.url]
    settings.TEACHER_API_KEYS = {"frontier": "APPRENTICE_TEST_TEACHER_KEY"}
    teacher = {"url": listener.url, "model": "fake", "key_name": "frontier"}

    assert shop_admin.patch("/api/v1/settings", {"teacher": teacher}).status_code == 200
    propose_targets_for(feedback_id=feedback.pk)

    assert listener.requests, "the offered teacher is asked"
    keys = {request["headers"].get("authorization") for request in listener.requests}
    assert keys == {"Bearer declared-teacher-key"}
    for secret in ("server-secret-value", "operator-vllm-key", settings.SECRET_KEY):
        assert secret not in sent_to(listener)


def test_a_stored_teacher_the_operator_no_longer_offers_is_not_called(
    shop, listener, feedback, settings
):
    settings.TEACHER_SERVERS = [listener.url]
    update_settings(project=shop, changes={"teacher": {"url": listener.url, "model": "fake"}})
    settings.TEACHER_SERVERS = []  # the operator withdraws it

    assert propose_targets_for(feedback_id=feedback.pk) == 0

    feedback.refresh_from_db()
    assert feedback.status == FeedbackStatus.FAILED
    assert "teacher.url refused" in feedback.failure_reason
    assert not DistillationTarget.objects.exists()
    assert listener.requests == []


# -- upstreams ---------------------------------------------------------------------------------


def test_an_upstream_with_a_path_of_its_own_and_a_query_is_refused(
    shop, shop_admin, own_server, harness_key
):
    tokenize = own_server.url.removesuffix("/v1") + "/tokenize?x="

    response = shop_admin.patch("/api/v1/settings", {"upstreams": [tokenize]})

    assert response.status_code == 422
    assert "upstreams" in response.json()["detail"] and "query" in response.json()["detail"]
    assert gateway_call(harness_key).status_code == 200
    assert [request["path"] for request in own_server.requests] == ["/v1/chat/completions"]


def test_an_upstream_the_operator_does_not_run_is_refused_and_gets_no_call(
    shop, shop_admin, listener, own_server, harness_key
):
    response = shop_admin.patch("/api/v1/settings", {"upstreams": [listener.url]})

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "upstreams.0" in detail and f"allowed: {own_server.url}" in detail
    assert gateway_call(harness_key).status_code == 200
    assert listener.requests == []


def test_a_stored_upstream_the_operator_no_longer_runs_gets_neither_calls_nor_the_vllm_key(
    shop, listener, own_server, harness_key, settings
):
    settings.MODEL_SERVERS = [own_server.url, listener.url]
    update_settings(project=shop, changes={"upstreams": [listener.url]})
    settings.MODEL_SERVERS = [own_server.url]  # the operator takes it off the list
    forget_cached_routes()

    assert gateway_call(harness_key).status_code == 200

    assert listener.requests == []
    keys = {request["headers"].get("authorization") for request in own_server.requests}
    assert keys == {"Bearer operator-vllm-key"}  # the operator's key, to the operator's server


def test_a_malformed_upstream_is_refused_and_the_gateway_keeps_answering(
    shop, shop_admin, harness_key
):
    response = shop_admin.patch("/api/v1/settings", {"upstreams": ["http://[::1"]})

    assert response.status_code == 422
    assert "upstreams" in response.json()["detail"]
    assert settings_for(Project.objects.get(pk=shop.pk)).upstreams == []
    answer = gateway_call(harness_key)
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"


# -- the gateway never answers HTML ------------------------------------------------------------


def _failing_routing(*args, **kwargs):
    raise RuntimeError("routing broke")


def test_an_unexpected_failure_is_an_openai_shaped_error_with_debug_on(
    shop, harness_key, settings, monkeypatch
):
    settings.DEBUG = True
    monkeypatch.setattr("reviewapp.gateway.views.destination_for", _failing_routing)

    response = gateway_call(harness_key)

    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "server_error" and set(error) == {"message", "type", "param", "code"}
    assert "routing broke" not in response.content.decode()  # the detail stays in the log


async def test_the_served_gateway_answers_json_for_failures_below_its_views(
    shop, harness_key, settings, monkeypatch
):
    """Through the production ASGI app: an unknown Host (a middleware's DisallowedHost) and a
    failing view are JSON too, DEBUG on."""
    from reviewapp.asgi import application

    settings.DEBUG = True
    headers = {"Authorization": f"Bearer {harness_key}", "Content-Type": "application/json"}
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://evil.example") as client:
        wrong_host = await client.post("/v1/chat/completions", content=orjson.dumps(CHAT))
    monkeypatch.setattr("reviewapp.gateway.views.destination_for", _failing_routing)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        failing = await client.post(
            "/v1/chat/completions", content=orjson.dumps(CHAT), headers=headers
        )

    assert (wrong_host.status_code, failing.status_code) == (400, 500)
    for response in (wrong_host, failing):
        assert response.headers["content-type"] == "application/json"
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_stored_settings_lose_an_environment_variables_name_and_unplain_urls_on_migrating(shop):
    """Migration 0022: settings stored before these rules still parse afterwards."""
    from django.apps import apps

    migration = importlib.import_module("reviewapp.migrations.0022_settings_within_reach")
    teacher = {"url": "http://127.0.0.1:9/v1?x=", "model": "m", "api_key_env": "HOME"}
    upstreams = ["http://127.0.0.1:8100/v1", "gopher://127.0.0.1/v1", "http://[::1"]
    Project.objects.filter(pk=shop.pk).update(settings={"teacher": teacher, "upstreams": upstreams})

    migration.forward(apps, None)

    stored = Project.objects.get(pk=shop.pk).settings
    assert stored == {
        "teacher": {"url": "", "model": "m"},
        "upstreams": ["http://127.0.0.1:8100/v1"],
    }
    assert settings_for(Project.objects.get(pk=shop.pk)).teacher.key_name == ""
