"""Feedback that could hang a worker or never fit a model is refused where it is written."""

import pytest
from django.test import Client

from reviewapp.review.feedback import MAX_CORRECTION_BYTES, MAX_FEEDBACK_TEXT_LENGTH
from reviewapp.review.models import Feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace
from tests.factories import make_trace

FEEDBACK = "/api/v1/traces/t-1/feedback"


@pytest.fixture
def stored(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return Trace.objects.get(project=project, external_id="t-1")


def test_a_backreference_check_is_422_at_the_api(api, stored):
    response = api.post(
        FEEDBACK,
        {"text": "No stutter.", "turn": 4, "checks": [{"kind": "not_regex", "value": r"(\w+) \1"}]},
    )
    assert response.status_code == 422
    assert "checks[0].value" in response.json()["detail"]
    assert "no backreferences" in response.json()["detail"]
    assert not Feedback.objects.exists()


def test_a_catastrophic_pattern_is_stored_because_re2_runs_it_in_linear_time(api, stored):
    response = api.post(
        FEEDBACK, {"text": "Only a's.", "turn": 4, "checks": [{"kind": "regex", "value": "(a+)+$"}]}
    )
    assert response.status_code == 201


def test_overlong_feedback_text_is_422(api, stored):
    response = api.post(FEEDBACK, {"text": "x" * (MAX_FEEDBACK_TEXT_LENGTH + 1), "turn": 4})
    assert response.status_code == 422
    assert "text:" in response.json()["detail"]
    assert not Feedback.objects.exists()


def test_an_oversized_correction_is_422(api, stored):
    correction = {"content": "8" * MAX_CORRECTION_BYTES}
    response = api.post(FEEDBACK, {"text": "Shorter.", "turn": 4, "correction": correction})
    assert response.status_code == 422
    assert f"over the limit of {MAX_CORRECTION_BYTES}" in response.json()["detail"]
    assert not Feedback.objects.exists()


def test_the_dashboard_form_shows_a_lookaround_as_a_form_error(bob, stored):
    client = Client()
    client.force_login(bob)
    response = client.post(
        f"/p/acme/traces/{stored.pk}/feedback/",
        {"anchor": "turn:4", "text": "Say Paris first.", "check_regex": "(?<=The )Paris"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 422
    assert "no backreferences or lookarounds" in response.content.decode()
    assert not Feedback.objects.exists()
