"""The route's state machine (reviewapp/learning/deploy.py) on real PostgreSQL.

Model servers are FAKE here: tests/fake_upstream.py over real HTTP, or an httpx transport that
answers the way vLLM does; the real vLLM deploy is in test_deploy_vllm.py.
"""

import httpx
import pytest

from reviewapp.learning.deploy import (
    DeployError,
    DeployRefused,
    deploy_adapter,
    deployment_of,
    promote_canary,
    rollback,
    set_canary_share,
)
from reviewapp.learning.models import Adapter, ModelRoute, TrainingRun
from reviewapp.projects.services import create_project
from tests.fake_upstream import FakeUpstream, free_port


@pytest.fixture
def fake_model_server():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def project(db, fake_model_server):
    return create_project(slug="shop", upstream_url=fake_model_server.url)


def make_adapter(project, version: int, gate: dict | None = None) -> Adapter:
    run = TrainingRun.objects.create(project=project, config={}, metrics={"gate": gate or {}})
    return Adapter.objects.create(
        project=project, version=version, name=f"shop-v{version}", path=f"/adapters/v{version}",
        base_model="b", checksum="c", run=run,
    )  # fmt: skip


@pytest.fixture
def v1(project):
    return make_adapter(project, 1)


@pytest.fixture
def v2(project):
    return make_adapter(project, 2)


def route_of(project) -> tuple:
    route = ModelRoute.objects.get(project=project)
    return (route.primary, route.canary, route.canary_share, route.previous_primary)


def test_deploy_routes_all_traffic_and_keeps_the_old_primary_for_rollback(project, v1, v2):
    ModelRoute.objects.create(project=project, primary="shop-v1")
    deploy_adapter(adapter=v2)
    assert route_of(project) == ("shop-v2", "", 0, "shop-v1")


def test_deploy_as_a_canary_leaves_the_primary_answering_the_rest(project, v1, v2):
    ModelRoute.objects.create(project=project, primary="shop-v1")
    deploy_adapter(adapter=v2, share=10)
    assert route_of(project) == ("shop-v1", "shop-v2", 10, "")


def test_a_model_server_that_is_down_fails_the_deploy_and_leaves_routing_alone(project, v1):
    project.upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    project.save()
    ModelRoute.objects.create(project=project, primary="shop-v0")
    with pytest.raises(DeployError, match="ConnectError"):
        deploy_adapter(adapter=v1, client=httpx.Client(timeout=1))
    assert route_of(project) == ("shop-v0", "", 0, "")


def test_a_share_outside_1_to_100_is_refused(v1):
    with pytest.raises(ValueError, match="share"):
        deploy_adapter(adapter=v1, share=0)


def test_an_adapter_the_gate_refused_is_not_loaded(project, fake_model_server):
    refused = make_adapter(project, 1, gate={"passed": False, "reason": "2 regressed"})
    with pytest.raises(DeployRefused, match="2 regressed"):
        deploy_adapter(adapter=refused)
    assert fake_model_server.requests == []
    assert not ModelRoute.objects.filter(project=project).exists()


def test_deploying_the_primary_again_is_refused(project, v1):
    ModelRoute.objects.create(project=project, primary="shop-v1", previous_primary="shop-v0")
    with pytest.raises(DeployRefused, match="already answers"):
        deploy_adapter(adapter=v1, share=10)
    assert route_of(project) == ("shop-v1", "", 0, "shop-v0")


def vllm_that_runs_during_the_load(change) -> httpx.Client:
    """A FAKE model server that calls `change` while it loads an adapter: another admin's
    deploy landing in the seconds this one spends loading."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        if request.url.path.endswith("/load_lora_adapter"):
            change()
            return httpx.Response(200, text="Success")
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}}
        return httpx.Response(200, json={"object": "chat.completion", "choices": [choice]})

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_a_route_that_changed_while_the_adapter_loaded_refuses_the_deploy(project, v1, v2):
    ModelRoute.objects.create(project=project, canary="shop-v2", canary_share=10)
    client = vllm_that_runs_during_the_load(lambda: promote_canary(adapter=v2))
    with pytest.raises(DeployRefused, match="route changed while shop-v1 was loading"):
        deploy_adapter(adapter=v1, client=client)
    assert route_of(project) == ("shop-v2", "", 0, "")  # the other admin's promotion stands


def test_promote_then_rollback_walks_the_route_back(project, v2):
    ModelRoute.objects.create(project=project, primary="shop-v1", canary="shop-v2", canary_share=10)
    promote_canary(adapter=v2)
    assert route_of(project) == ("shop-v2", "", 0, "shop-v1")
    rollback(adapter=v2)
    assert route_of(project) == ("shop-v1", "", 0, "")


def test_rolling_back_the_canary_drops_it_and_keeps_the_primary(project, v2):
    ModelRoute.objects.create(project=project, primary="shop-v1", canary="shop-v2", canary_share=10)
    rollback(adapter=v2)
    assert route_of(project) == ("shop-v1", "", 0, "")


def test_set_share_changes_only_the_canary_share(project, v2):
    ModelRoute.objects.create(project=project, primary="shop-v1", canary="shop-v2", canary_share=10)
    set_canary_share(adapter=v2, share=40)
    assert route_of(project) == ("shop-v1", "shop-v2", 40, "")


# Refused transitions: each raises DeployRefused and leaves the row as it was.


def test_promote_with_no_canary_is_refused(project, v1):
    ModelRoute.objects.create(project=project, primary="shop-v0")
    with pytest.raises(DeployRefused, match="no canary to promote"):
        promote_canary(adapter=v1)
    assert route_of(project) == ("shop-v0", "", 0, "")


def test_promoting_an_adapter_that_is_not_the_canary_is_refused(project, v1):
    ModelRoute.objects.create(project=project, canary="shop-v2", canary_share=10)
    with pytest.raises(DeployRefused, match="shop-v1 is not the canary"):
        promote_canary(adapter=v1)
    assert route_of(project) == ("", "shop-v2", 10, "")


def test_changing_the_share_of_an_adapter_that_is_not_the_canary_is_refused(project, v1):
    ModelRoute.objects.create(project=project, primary="shop-v1")
    with pytest.raises(DeployRefused, match="no canary"):
        set_canary_share(adapter=v1, share=20)
    assert route_of(project) == ("shop-v1", "", 0, "")


def test_rolling_back_an_adapter_that_is_not_routed_is_refused(project, v1):
    """A page opened on v1 before v2 replaced it cannot roll back v2's deploy."""
    ModelRoute.objects.create(project=project, primary="shop-v2", previous_primary="shop-v1")
    with pytest.raises(DeployRefused, match="shop-v1 is not serving traffic"):
        rollback(adapter=v1)
    assert route_of(project) == ("shop-v2", "", 0, "shop-v1")


def test_rolling_back_a_primary_while_a_canary_runs_is_refused(project, v1):
    ModelRoute.objects.create(project=project, primary="shop-v1", canary="shop-v2", canary_share=5)
    with pytest.raises(DeployRefused, match="canary shop-v2 first"):
        rollback(adapter=v1)
    assert route_of(project) == ("shop-v1", "shop-v2", 5, "")


def test_a_refused_change_on_a_project_with_no_route_creates_none(project, v1):
    with pytest.raises(DeployRefused):
        rollback(adapter=v1)
    assert not ModelRoute.objects.filter(project=project).exists()


# Where an adapter stands


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        (None, ("idle", 0, "not serving")),
        ({"primary": "shop-v1"}, ("serving", 100, "primary")),
        ({"primary": "shop-v1", "canary": "shop-v2", "canary_share": 30},
         ("serving", 70, "primary")),
        ({"primary": "shop-v2", "canary": "shop-v1", "canary_share": 30}, ("canary", 30, "canary")),
        ({"primary": "shop-v2", "previous_primary": "shop-v1"}, ("idle", 0, "previous primary")),
    ],
)  # fmt: skip
def test_deployment_of_says_where_an_adapter_stands(project, v1, route, expected):
    row = ModelRoute(project=project, **route) if route is not None else None
    deployment = deployment_of(v1, row)
    assert (deployment.state, deployment.share, deployment.label) == expected
