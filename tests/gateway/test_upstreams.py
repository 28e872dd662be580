"""Several model servers per project: the gateway takes turns across the healthy ones and skips
a failing one for a cooldown; a deploy loads the adapter on each and routes on a quorum.

Model servers are FAKE (tests/fake_upstream.py over real HTTP); one of them fails on purpose.
"""

import asyncio
import socket

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.test import AsyncClient, Client, override_settings

from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.learning.deploy import DeployError, deploy_adapter
from reviewapp.learning.models import Adapter, ModelRoute, TrainingRun
from reviewapp.projects.project_settings import SettingsError, update_settings
from reviewapp.projects.services import create_api_key, create_project
from tests.fake_upstream import FakeUpstream


class FailingUpstream(FakeUpstream):
    """A model server that answers every request with `status` until `recover()`."""

    def __init__(self, status: int = 503, message: str = "the server is starting") -> None:
        super().__init__()
        self.status, self.message, self.failing = status, message, True

    def recover(self) -> None:
        self.failing = False

    async def app(self, scope, receive, send):
        if scope["type"] == "http" and self.failing:
            self.requests.append({"path": scope["path"], "headers": {}, "body": {}})
            error = {"message": self.message, "type": "error", "code": self.status}
            await self._json(send, self.status, {"error": error})
            return
        await super().app(scope, receive, send)


@pytest.fixture(autouse=True)
def operator_servers(settings):
    """The operator's MODEL_SERVERS, restored after each test; operator_runs() adds to it."""
    settings.MODEL_SERVERS = [*settings.MODEL_SERVERS]


def operator_runs(*urls: str) -> None:
    """The servers a test starts are the operator's: a project may name them (outbound.py)."""
    django_settings.MODEL_SERVERS = [*django_settings.MODEL_SERVERS, *urls]


@pytest.fixture
def healthy():
    servers = [FakeUpstream().start(), FakeUpstream().start()]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def failing():
    server = FailingUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def unreachable():
    """A server whose machine is down without refusing: connection attempts time out. A real
    listening socket whose accept queue is full (one connection held, never accepted), so the
    kernel drops further connection attempts, as a dead host's network does."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    filler = socket.create_connection(listener.getsockname())
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    filler.close()
    listener.close()


def chat_calls(server: FakeUpstream) -> int:
    return sum(request["path"].endswith("/chat/completions") for request in server.requests)


def serve_from(project, servers) -> None:
    operator_runs(*(server.url for server in servers))
    update_settings(project=project, changes={"upstreams": [server.url for server in servers]})
    forget_cached_routes()


def chat(key: str):
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}
    return AsyncClient().post(
        "/v1/chat/completions",
        orjson.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def test_an_upstream_that_is_not_a_url_is_refused(project):
    with pytest.raises(SettingsError, match="upstreams"):
        update_settings(project=project, changes={"upstreams": ["model-server:8000"]})


def test_the_same_upstream_twice_is_refused(project):
    with pytest.raises(SettingsError, match="twice"):
        update_settings(
            project=project, changes={"upstreams": ["http://a:8000/v1", "http://A:8000/v1/"]}
        )


@pytest.mark.django_db(transaction=True)
async def test_the_gateway_takes_turns_across_healthy_upstreams(healthy):
    key = await gateway_key(healthy)
    for _ in range(6):
        assert (await chat(key)).status_code == 200
    assert [chat_calls(server) for server in healthy] == [3, 3]
    assert recorder.wait_until_idle(10)


@pytest.mark.django_db(transaction=True)
async def test_a_failing_upstream_is_skipped_and_every_call_is_answered(healthy, failing):
    key = await gateway_key([failing, healthy[0]])
    for _ in range(6):
        assert (await chat(key)).status_code == 200
    assert chat_calls(failing) == 1  # failed once, then left alone for its cooldown
    assert chat_calls(healthy[0]) == 6
    assert recorder.wait_until_idle(10)


@pytest.mark.django_db(transaction=True)
async def test_a_server_whose_connections_time_out_is_skipped_and_the_call_answered(
    healthy, unreachable
):
    project = await sync_to_async(create_project)(slug="shop")
    operator_runs(unreachable, healthy[0].url)
    await sync_to_async(update_settings)(
        project=project, changes={"upstreams": [unreachable, healthy[0].url]}
    )
    forget_cached_routes()
    key = (await sync_to_async(create_api_key)(project=project))[1]
    with override_settings(GATEWAY_CONNECT_TIMEOUT=0.3):
        for _ in range(3):
            assert (await chat(key)).status_code == 200
    assert chat_calls(healthy[0]) == 3
    assert recorder.wait_until_idle(10)


@pytest.mark.django_db(transaction=True)
async def test_a_failed_upstream_gets_calls_again_after_its_cooldown(healthy, failing):
    key = await gateway_key([failing, healthy[0]])
    with override_settings(GATEWAY_UPSTREAM_COOLDOWN_SECONDS=1.0):
        for _ in range(2):
            assert (await chat(key)).status_code == 200
        failing.recover()
        for _ in range(2):
            assert (await chat(key)).status_code == 200
        assert chat_calls(failing) == 1  # still cooling down
        await asyncio.sleep(1.1)
        for _ in range(2):
            assert (await chat(key)).status_code == 200
    assert chat_calls(failing) == 2  # back in turn with the other server
    assert recorder.wait_until_idle(10)


@sync_to_async
def gateway_key(servers) -> str:
    project = create_project(slug="shop")
    serve_from(project, servers)
    return create_api_key(project=project)[1]


def make_adapter(project) -> Adapter:
    return Adapter.objects.create(
        project=project, version=1, name="acme-v1", path="/adapters/acme-v1", base_model="b",
        checksum="c",
    )  # fmt: skip


@pytest.fixture
def refusing():
    """A server that cannot read the shared adapter store: vLLM answers 404 to the load."""
    server = FailingUpstream(404, "The lora adapter 'acme-v1' cannot be found.").start()
    yield server
    server.stop()


def loads(server: FakeUpstream) -> list[dict]:
    return [r["body"] for r in server.requests if r["path"].endswith("/load_lora_adapter")]


def test_a_deploy_loads_the_adapter_on_every_upstream(project, healthy):
    serve_from(project, healthy)
    adapter = make_adapter(project)
    deploy_adapter(adapter=adapter)
    for server in healthy:
        assert loads(server) == [{"lora_name": "acme-v1", "lora_path": "/adapters/acme-v1"}]
    assert ModelRoute.objects.get(project=project).primary == "acme-v1"


def test_a_deploy_one_server_refused_leaves_routing_alone_and_records_each_server(
    project, healthy, refusing
):
    serve_from(project, [healthy[0], refusing])
    adapter = make_adapter(project)
    with pytest.raises(DeployError, match="1 of 2 model servers"):
        deploy_adapter(adapter=adapter)
    assert not ModelRoute.objects.filter(project=project, primary="acme-v1").exists()
    servers = Adapter.objects.get(pk=adapter.pk).eval_results["deploy"]["servers"]
    assert [(s["url"], s["loaded"]) for s in servers] == [
        (healthy[0].url, True),
        (refusing.url, False),
    ]
    assert "cannot be found" in servers[1]["error"]


@override_settings(DEPLOY_QUORUM=1)
def test_a_quorum_of_one_routes_when_one_server_took_the_adapter(project, healthy, refusing):
    serve_from(project, [healthy[0], refusing])
    deploy_adapter(adapter=make_adapter(project))
    assert ModelRoute.objects.get(project=project).primary == "acme-v1"


def test_a_projects_own_quorum_routes_when_that_many_servers_took_the_adapter(
    project, healthy, refusing
):
    serve_from(project, [healthy[0], refusing])
    update_settings(project=project, changes={"deploy_quorum": 1})
    deploy_adapter(adapter=make_adapter(project))
    assert ModelRoute.objects.get(project=project).primary == "acme-v1"


@pytest.mark.parametrize("page", ["adapter", "run"])
def test_the_adapter_and_run_pages_show_each_servers_deploy_outcome(
    project, alice, healthy, refusing, page
):
    serve_from(project, [healthy[0], refusing])
    adapter = make_adapter(project)
    adapter.run = TrainingRun.objects.create(project=project, config={}, status="deploy_failed")
    adapter.save()
    with pytest.raises(DeployError):
        deploy_adapter(adapter=adapter)
    client = Client()
    client.force_login(alice)
    url = "/p/acme/adapters/1/" if page == "adapter" else f"/p/acme/runs/{adapter.run.pk}/"
    shown = client.get(url).content.decode()
    assert f'<code>{refusing.url}</code> <span class="badge error">failed</span>' in shown
    assert f'<code>{healthy[0].url}</code> <span class="badge completed">loaded</span>' in shown
