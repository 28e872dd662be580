"""The gateway forwards only a project's own model names: a shared model server also serves
other projects' adapters (named <slug>-v<N>), which another project's key must not reach."""

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.learning.models import Adapter, ModelRoute
from reviewapp.projects.services import create_api_key, create_project
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)  # the recorder writes from its own thread

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def projects(upstream):
    """acme has trained acme-v1; globex shares the same model server."""
    forget_cached_routes()
    acme = create_project(slug="acme", upstream_url=upstream.url, served_model="acme-agent")
    globex = create_project(slug="globex", upstream_url=upstream.url, served_model="globex-agent")
    Adapter.objects.create(
        project=acme, version=1, name="acme-v1", path="/adapters/acme-v1", base_model="b"
    )
    yield {
        "acme": acme,
        "acme_key": create_api_key(project=acme)[1],
        "acme_admin_key": create_api_key(project=acme, scopes=["admin"])[1],
        "globex_key": create_api_key(project=globex)[1],
    }
    assert recorder.wait_until_idle(15)


def chat(key: str, model: str):
    return AsyncClient().post(
        "/v1/chat/completions",
        orjson.dumps({"model": model, "messages": USER}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


async def test_another_projects_adapter_is_404_model_not_found(projects):
    response = await chat(projects["globex_key"], "acme-v1")
    assert response.status_code == 404
    error = orjson.loads(response.content)["error"]
    # OpenAI's own answer for a model a key cannot use: no param, code model_not_found
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        None,
        "model_not_found",
    )
    assert "`acme-v1`" in error["message"]
    assert not await ModelCall.objects.aexists()  # nothing reached the model server


async def test_a_project_calls_its_own_adapter_by_name(projects):
    response = await chat(projects["acme_key"], "acme-v1")
    assert response.status_code == 200
    assert orjson.loads(response.content)["model"] == "acme-v1"


async def test_the_base_model_name_reaches_the_base(projects):
    response = await chat(projects["acme_key"], projects["acme"].base_model)
    assert response.status_code == 200
    assert orjson.loads(response.content)["model"] == "acme-agent"  # the base's upstream name


async def test_a_key_without_the_ingest_scope_cannot_use_the_gateway(projects):
    response = await chat(projects["acme_admin_key"], "acme-agent")
    assert response.status_code == 403
    assert orjson.loads(response.content)["error"]["code"] == "insufficient_scope"


async def test_an_alias_that_is_also_the_base_models_name_follows_the_route(upstream):
    """By default a project's alias and its base model have the same name: the alias must still
    go where the route says (the deployed adapter), not to the base."""
    forget_cached_routes()
    project = await create_project_async(upstream.url)
    await ModelRoute.objects.acreate(project=project, primary="plain-v1")
    key = await sync_to_async(create_api_key)(project=project)

    response = await chat(key[1], project.served_model)

    assert project.served_model == project.base_model
    assert response.status_code == 200
    assert orjson.loads(response.content)["model"] == "plain-v1"
    assert recorder.wait_until_idle(15)


@sync_to_async
def create_project_async(upstream_url: str):
    project = create_project(slug="plain", upstream_url=upstream_url)
    Adapter.objects.create(
        project=project, version=1, name="plain-v1", path="/adapters/plain-v1", base_model="b"
    )
    return project
