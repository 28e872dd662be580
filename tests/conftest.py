import pytest
from django.contrib.auth import get_user_model

from reviewapp.models import Membership
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


def make_user(username: str):
    return get_user_model().objects.create_user(username, password="correct horse battery")


@pytest.fixture
def alice(project):
    """An admin of the acme project."""
    user = make_user("alice")
    Membership.objects.create(project=project, user=user, role="admin")
    return user


@pytest.fixture
def bob(project):
    """A reviewer of the acme project."""
    user = make_user("bob")
    Membership.objects.create(project=project, user=user, role="reviewer")
    return user


@pytest.fixture
def victor(project):
    """A viewer of the acme project: reads, never writes."""
    user = make_user("victor")
    Membership.objects.create(project=project, user=user, role="viewer")
    return user


@pytest.fixture
def mallory(other_project):
    """A member of another project only."""
    user = make_user("mallory")
    Membership.objects.create(project=other_project, user=user, role="admin")
    return user
