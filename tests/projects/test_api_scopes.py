"""Who may change the model: what each API key scope lets a key do (docs/reliability.md)."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from reviewapp.api.app import api as ninja_api
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.proposals import propose_targets_for
from reviewapp.projects.models import ApiKey
from reviewapp.review.models import Feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import ApiClient, make_trace

ADMIN_ROUTES = [
    ("post", "/api/v1/runs"),
    ("get", "/api/v1/runs/1"),
    ("get", "/api/v1/adapters"),
    ("get", "/api/v1/lessons"),
    ("get", "/api/v1/export.jsonl"),
]
CORRECTION = {"text": "Lead with the number.", "turn": 4, "correction": {"content": "84."}}


@pytest.fixture
def stored(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_the_harness_key_is_refused_admin_routes_naming_the_scope(api, method, path):
    response = getattr(api, method)(path)
    assert response.status_code == 403
    assert response.json()["error"] == "insufficient_scope"
    assert "'admin' scope" in response.json()["detail"]
    assert 'scope="admin"' in response["WWW-Authenticate"]


def test_an_admin_key_starts_runs(admin_api, stored):
    # Nothing is approved yet: the refusal is about the data, not the key.
    response = admin_api.post("/api/v1/runs", {})
    assert response.status_code == 422


def test_a_key_without_the_ingest_scope_cannot_send_traces(project):
    from reviewapp.projects.services import create_api_key

    admin_only = ApiClient(create_api_key(project=project, scopes=["admin"])[1])
    response = admin_only.post("/api/v1/traces", {"traces": [make_trace("t-9")]})
    assert response.status_code == 403
    assert "'ingest' scope" in response.json()["detail"]


def test_every_operation_states_its_scopes_in_the_openapi_document():
    for path, operations in ninja_api.get_openapi_schema()["paths"].items():
        for method, operation in operations.items():
            scopes = operation.get("x-required-scopes")
            assert scopes, f"{method.upper()} {path} states no scope"
            assert all(f"`{scope}`" in operation["description"] for scope in scopes)


def test_a_correction_from_the_harness_key_is_stored_but_not_a_reviewers(api, stored):
    response = api.post("/api/v1/traces/t-1/feedback", CORRECTION)
    assert response.status_code == 201
    assert response.json()["from_reviewer"] is False
    assert Feedback.objects.get().from_reviewer is False


def test_a_correction_from_a_review_key_is_a_reviewers(review_api, stored):
    response = review_api.post("/api/v1/traces/t-1/feedback", CORRECTION)
    assert response.json()["from_reviewer"] is True


def test_a_claimed_author_is_kept_but_marked_as_sent_by_the_key(api, api_key, stored):
    response = api.post("/api/v1/traces/t-1/feedback", {**CORRECTION, "author": "alice"})
    feedback = Feedback.objects.get()
    assert (feedback.author, feedback.api_key.prefix) == ("alice", api_key[: ApiKey.PREFIX_LENGTH])
    assert response.json()["api_key"] == api_key[: ApiKey.PREFIX_LENGTH]
    assert (feedback.reviewer, feedback.from_reviewer) == (None, False)


def test_the_harness_key_applies_known_tags_and_reports_unknown_ones(api, project):
    Tag.objects.create(project=project, name="slow")
    trace = make_trace("t-2", tags=["slow", "poisoned"])
    [result] = api.post("/api/v1/traces", {"traces": [trace]}).json()["results"]
    assert result["status"] == 201
    assert any("'poisoned' is not in the project's taxonomy" in w for w in result["warnings"])
    assert list(Tag.objects.values_list("name", flat=True)) == ["slow"]
    assert list(TraceTag.objects.values_list("tag__name", flat=True)) == ["slow"]


def test_a_review_key_adds_tags_to_the_taxonomy(review_api, project):
    review_api.post("/api/v1/traces", {"traces": [make_trace("t-2", tags=["new-kind"])]})
    assert Tag.objects.filter(project=project, name="new-kind").exists()


def test_create_api_key_takes_repeated_scopes_and_defaults_to_ingest(project):
    for args in (["--scope", "review", "--scope", "admin"], []):
        call_command("create_api_key", "acme", *args, stdout=StringIO(), stderr=StringIO())
    assert list(ApiKey.objects.order_by("id").values_list("scopes", flat=True)) == [
        ["admin", "review"],
        ["ingest"],
    ]


def test_the_keys_page_creates_a_scoped_key_once_and_shows_its_scopes(alice, project):
    client = Client()
    client.force_login(alice)
    response = client.post("/p/acme/keys/", {"name": "ops", "scopes": ["review", "admin"]})
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert 'id="new-secret"' in page
    assert "admin, review" in page
    reloaded = client.get("/p/acme/keys/").content.decode()
    assert 'id="new-secret"' not in reloaded
    assert ApiKey.objects.get().scopes == ["admin", "review"]


def test_the_keys_page_needs_a_scope(alice, project):
    client = Client()
    client.force_login(alice)
    response = client.post("/p/acme/keys/", {"name": "none"})
    assert response.status_code == 422
    assert not ApiKey.objects.exists()


def test_the_harness_keys_correction_becomes_a_proposal_a_reviewer_must_approve(api, stored):
    api.post("/api/v1/traces/t-1/feedback", CORRECTION)

    propose_targets_for(feedback_id=Feedback.objects.get().pk)

    [target] = DistillationTarget.objects.all()
    assert (target.source, target.state) == ("correction", TargetState.PROPOSED)


def test_a_review_keys_correction_is_an_approved_target(review_api, stored):
    review_api.post("/api/v1/traces/t-1/feedback", CORRECTION)

    propose_targets_for(feedback_id=Feedback.objects.get().pk)

    [target] = DistillationTarget.objects.all()
    assert (target.source, target.state) == ("correction", TargetState.APPROVED)
