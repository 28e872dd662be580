"""Production settings pass `check --deploy`, secrets come only from the environment, API keys
are stored hashed, and no credential the gateway sees is stored anywhere."""

import asyncio
import contextlib
import os
import subprocess
import sys
import zlib
from pathlib import Path

import orjson
import pytest
from django.apps import apps
from django.test import AsyncClient

from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.projects.models import ApiKey
from reviewapp.projects.services import create_api_key, create_project
from tests.fake_upstream import FakeUpstream

REPO_ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_SECRET = "vllm-upstream-secret-5d2c"


def _manage(*args: str, **environment: str) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env={**base, **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )


PRODUCTION = {
    "DJANGO_DEBUG": "false",
    "DJANGO_SECRET_KEY": "a-production-secret-from-the-environment-9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d",
    "DJANGO_ALLOWED_HOSTS": "apprentice.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://apprentice.example.com",
}


def test_check_deploy_is_clean_with_production_settings():
    finished = _manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "no issues" in finished.stdout


def test_production_refuses_to_start_with_the_default_secret_key():
    environment = {**PRODUCTION}
    del environment["DJANGO_SECRET_KEY"]
    finished = _manage("check", **environment)
    assert finished.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in finished.stderr


def _every_stored_value() -> str:
    """Every column of every row in the database, compressed bodies opened, as one string."""
    parts = []
    for model in apps.get_models():
        if not model._meta.managed:  # a view of another model's table (TraceVector), read there
            continue
        fields = [field.attname for field in model._meta.concrete_fields]
        for row in model.objects.values_list(*fields):
            for value in row:
                if isinstance(value, bytes | memoryview):
                    raw = bytes(value)
                    with contextlib.suppress(zlib.error):
                        raw = zlib.decompress(raw)
                    parts.append(raw.decode(errors="replace"))
                else:
                    parts.append(orjson.dumps(value, default=str).decode())
    return "\n".join(parts)


@pytest.mark.django_db
def test_api_keys_are_stored_as_hashes_only():
    project = create_project(slug="acme")
    _key, secret = create_api_key(project=project)
    stored = _every_stored_value()
    assert secret not in stored
    assert secret[ApiKey.PREFIX_LENGTH :] not in stored  # only the short prefix is shown
    assert ApiKey.hash_secret(secret) in stored


@pytest.fixture
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.mark.django_db(transaction=True)  # the recorder writes from its own thread
async def test_the_gateway_stores_no_credential_in_any_row(upstream, settings):
    settings.VLLM_API_KEY = UPSTREAM_SECRET
    forget_cached_routes()
    project = await asyncio.to_thread(
        create_project, slug="shop", upstream_url=upstream.url, served_model="shop-agent"
    )
    _, secret = await asyncio.to_thread(create_api_key, project=project)
    client = AsyncClient()
    for stream, model in ((False, "shop-agent"), (True, "shop-agent"), (False, "broken-model")):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        response = await client.post(
            "/v1/chat/completions",
            orjson.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {secret}", "X-Trace-Id": "episode-1"},
        )
        if stream:
            b"".join([chunk async for chunk in response.streaming_content])
    assert await asyncio.to_thread(recorder.wait_until_idle, 15)

    stored = await asyncio.to_thread(_every_stored_value)
    assert "episode-1" in stored and "echo: hi" in stored  # the calls were recorded...
    for credential in (secret, secret[ApiKey.PREFIX_LENGTH :], UPSTREAM_SECRET, "Bearer "):
        assert credential not in stored  # ...and no credential with them
    # The upstream got the gateway's own key, never the harness's.
    sent = [request["headers"].get("authorization", "") for request in upstream.requests]
    assert sent and all(header == f"Bearer {UPSTREAM_SECRET}" for header in sent)
