import httpx
import pytest

from reviewapp.models import Adapter, ModelRoute
from reviewapp.services.deploy import DeployError, deploy_adapter, promote_canary, rollback
from reviewapp.services.projects import create_project
from tests.fake_upstream import free_port


@pytest.fixture
def adapter(db, tmp_path):
    project = create_project(slug="shop", upstream_url=f"http://127.0.0.1:{free_port()}/v1")
    return Adapter.objects.create(
        project=project, version=1, name="shop-v1", path=str(tmp_path), base_model="b",
        checksum="c",
    )  # fmt: skip


def test_a_model_server_that_is_down_fails_the_deploy_and_leaves_routing_alone(adapter):
    ModelRoute.objects.create(project=adapter.project, primary="shop-v0")
    with pytest.raises(DeployError, match="ConnectError"):
        deploy_adapter(adapter=adapter, client=httpx.Client(timeout=1))
    route = ModelRoute.objects.get(project=adapter.project)
    assert (route.primary, route.canary, route.canary_share) == ("shop-v0", "", 0)


def test_promote_then_rollback_walks_the_route_back(adapter):
    project = adapter.project
    ModelRoute.objects.create(project=project, primary="shop-v0", canary="shop-v1", canary_share=10)
    promote_canary(project=project)
    route = ModelRoute.objects.get(project=project)
    assert (route.primary, route.previous_primary, route.canary) == ("shop-v1", "shop-v0", "")
    rollback(project=project)
    assert ModelRoute.objects.get(project=project).primary == "shop-v0"


def test_rollback_drops_a_canary_first(adapter):
    project = adapter.project
    ModelRoute.objects.create(project=project, primary="shop-v0", canary="shop-v1", canary_share=10)
    rollback(project=project)
    route = ModelRoute.objects.get(project=project)
    assert (route.primary, route.canary, route.canary_share) == ("shop-v0", "", 0)


def test_a_share_outside_1_to_100_is_refused(adapter):
    with pytest.raises(ValueError, match="share"):
        deploy_adapter(adapter=adapter, share=0)
