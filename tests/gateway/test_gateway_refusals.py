"""Requests the gateway refuses before the model sees them are counted per project and reason,
shown on the monitors page and over the API, and never stored as traces."""

import time

import orjson
import pytest
from django.test import Client

from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.monitors.models import GatewayRefusal, RefusalReason
from reviewapp.monitors.refusals import RefusalCounter, recent_refusals
from reviewapp.projects.services import create_api_key
from reviewapp.traces.models import Trace
from tests.factories import ApiClient

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture
def counter(refusals) -> RefusalCounter:
    """The test's own counter (tests/conftest.py), flushed by the test."""
    forget_cached_routes()
    return refusals


def chat(key: str | None, body: dict | bytes):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return Client().post(
        "/v1/chat/completions", content, content_type="application/json", headers=headers
    )


def refuse_a_few(key: str) -> None:
    assert chat(key, {"model": "gpt-4o", "messages": USER}).status_code == 404
    assert chat(key, {"model": "gpt-4o", "messages": USER}).status_code == 404
    assert chat(key, {"model": "acme-agent", "messages": []}).status_code == 400
    assert chat(key, b"{nope").status_code == 400
    assert chat("apk_wrong", {"model": "acme-agent", "messages": USER}).status_code == 401


@pytest.fixture
def acme_key(project) -> str:
    project.served_model = "acme-agent"
    project.save()
    return create_api_key(project=project)[1]


def test_refusals_are_counted_per_project_and_reason_not_stored(counter, project, acme_key):
    refuse_a_few(acme_key)
    counter.flush()
    assert recent_refusals(project) == {"invalid_request": 2, "model_not_found": 2}
    # a key nobody holds names no project: counted, shown to none
    assert GatewayRefusal.objects.get(project=None).count == 1
    assert not Trace.objects.exists()


def test_a_second_flush_adds_to_the_hours_row(counter, project, acme_key):
    refuse_a_few(acme_key)
    counter.flush()
    refuse_a_few(acme_key)
    counter.flush()
    assert recent_refusals(project)["model_not_found"] == 4
    assert GatewayRefusal.objects.filter(project=project, reason="model_not_found").count() == 1


@pytest.mark.django_db(transaction=True)  # the counter's thread writes on its own connection
def test_the_process_counter_writes_from_its_own_thread(project):
    counter = RefusalCounter(flush_seconds=0.2)
    counter.count(project_id=project.id, reason=RefusalReason.MODEL_NOT_FOUND)
    deadline = time.monotonic() + 10
    while not GatewayRefusal.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recent_refusals(project) == {"model_not_found": 1}


def test_a_key_without_the_ingest_scope_is_counted(counter, project):
    review_only = create_api_key(project=project, scopes=["review"])[1]
    assert chat(review_only, {"model": "acme-agent", "messages": USER}).status_code == 403
    counter.flush()
    assert recent_refusals(project) == {"insufficient_scope": 1}


def test_the_api_reports_the_keys_projects_refusals_only(
    counter, project, acme_key, other_api, other_project
):
    refuse_a_few(acme_key)
    counter.flush()
    response = ApiClient(acme_key).get("/api/v1/gateway/refusals")
    assert response.status_code == 200
    assert response.json() == {
        "hours": 24,
        "refusals": [
            {"reason": "invalid_request", "count": 2},
            {"reason": "model_not_found", "count": 2},
        ],
    }
    assert other_api.get("/api/v1/gateway/refusals").json()["refusals"] == []


def test_the_api_refuses_a_window_out_of_range(api):
    response = api.get("/api/v1/gateway/refusals", hours=0)
    assert response.status_code == 422
    assert "hours" in response.json()["detail"]


def test_the_monitors_page_shows_the_refusals(counter, project, acme_key, bob):
    refuse_a_few(acme_key)
    counter.flush()
    client = Client()
    client.force_login(bob)
    page = client.get(f"/p/{project.slug}/monitors/").content.decode()
    section = page[page.index('id="gateway-refusals"') :]
    assert "<code>model_not_found</code></td><td>2</td>" in section
    assert "<code>invalid_request</code></td><td>2</td>" in section
    assert "invalid_api_key" not in section
