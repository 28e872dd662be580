"""A revoked key stops working on the gateway at once in the process that revoked it, though the
gateway caches what a key may do (reviewapp/gateway/routing.py)."""

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient, Client

from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.projects.models import ApiKey
from reviewapp.projects.services import create_api_key, revoke_api_key

pytestmark = pytest.mark.django_db(transaction=True)  # revocation clears the cache on commit


@pytest.fixture
def key(project):
    forget_cached_routes()
    return create_api_key(project=project)[1]


def models_with(key: str):
    return AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {key}"})


def make_superuser():
    return get_user_model().objects.create_superuser("root", password="correct horse battery")


def the_key(secret: str) -> ApiKey:
    return ApiKey.objects.get(secret_hash=ApiKey.hash_secret(secret))


async def test_a_revoked_key_gets_401_on_the_very_next_call(key):
    assert (await models_with(key)).status_code == 200  # now cached as valid
    await sync_to_async(revoke_api_key)(key=await sync_to_async(the_key)(key))
    assert (await models_with(key)).status_code == 401


async def test_a_key_revoked_on_the_keys_page_gets_401_on_the_very_next_call(alice, key):
    assert (await models_with(key)).status_code == 200

    def revoke_on_the_page():
        client = Client()
        client.force_login(alice)
        return client.post(f"/p/acme/keys/{the_key(key).pk}/revoke/")

    assert (await sync_to_async(revoke_on_the_page)()).status_code == 302
    assert (await models_with(key)).status_code == 401


async def test_a_key_revoked_in_the_django_admin_gets_401_on_the_very_next_call(key):
    assert (await models_with(key)).status_code == 200

    def revoke_in_the_admin():
        client = Client()
        client.force_login(make_superuser())
        return client.post(
            "/admin/reviewapp/apikey/",
            {"action": "revoke", "_selected_action": [the_key(key).pk]},
        )

    assert (await sync_to_async(revoke_in_the_admin)()).status_code == 302
    assert (await models_with(key)).status_code == 401
