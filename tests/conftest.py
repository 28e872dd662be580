import pytest

from reviewapp.services.projects import create_api_key, create_project
from tests.factories import ApiClient


@pytest.fixture
def project(db):
    return create_project(slug="acme", name="Acme support agent")


@pytest.fixture
def other_project(db):
    return create_project(slug="globex", name="Globex")


@pytest.fixture
def api_key(project) -> str:
    return create_api_key(project=project)[1]


@pytest.fixture
def other_api_key(other_project) -> str:
    return create_api_key(project=other_project)[1]


@pytest.fixture
def api(api_key) -> ApiClient:
    return ApiClient(api_key)


@pytest.fixture
def other_api(other_api_key) -> ApiClient:
    return ApiClient(other_api_key)
