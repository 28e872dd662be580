"""Deleting feedback: what a run trained on is dismissed and keeps its lineage; the rest goes.

The dashboard (its author deletes) and the API behave the same. Over the API a harness's key
(ingest scope) deletes what ingest keys sent; a reviewer's work needs a key with the review scope.
"""

import pytest
from django.db.models import ProtectedError
from django.test import Client

from reviewapp.learning.dataset import build_training_set
from reviewapp.learning.models import (
    Adapter,
    DistillationTarget,
    RunStatus,
    TargetState,
    TrainingRun,
)
from reviewapp.projects.services import create_api_key
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.ingest import ingest_traces
from tests.factories import ApiClient, make_trace


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


def approved_target(feedback: Feedback) -> DistillationTarget:
    messages = feedback.trace.body_json()["messages"]
    return DistillationTarget.objects.create(
        feedback=feedback, turn=4, source="correction", student_context=messages[:4],
        target={"role": "assistant", "content": "Answer: 84."}, state=TargetState.APPROVED,
    )  # fmt: skip


def trained_on(feedback: Feedback) -> Adapter:
    """An adapter whose run learned from the feedback's target."""
    project = feedback.trace.project
    run = TrainingRun.objects.create(project=project, config={}, status=RunStatus.TRAINED)
    run.targets.add(approved_target(feedback))
    return Adapter.objects.create(
        project=project, version=1, name="acme-v1", path="/adapters/acme-v1", base_model="b",
        checksum="c", run=run,
    )  # fmt: skip


def feedback_by(trace, reviewer=None, text="Begin with 'Answer:'.") -> Feedback:
    return record_feedback(trace=trace, turn=4, text=text, reviewer=reviewer)[0]


def sent_by(api, text="Begin with 'Answer:'.", **fields) -> Feedback:
    response = api.post("/api/v1/traces/t-1/feedback", {"text": text, "turn": 4, **fields})
    assert response.status_code == 201
    return Feedback.objects.get(pk=response.json()["id"])


def delete_in_dashboard(user, feedback: Feedback):
    client = Client()
    client.force_login(user)
    return client.post(f"/p/acme/traces/{feedback.trace_id}/feedback/{feedback.pk}/delete/")


def api_delete(api, feedback: Feedback):
    url = f"/api/v1/traces/{feedback.trace.external_id}/feedback/{feedback.pk}"
    return api.client.delete(url, headers=api.headers)


def test_deleting_feedback_an_adapter_learned_from_dismisses_it_instead(trace, bob):
    feedback = feedback_by(trace, bob)
    trained_on(feedback)
    delete_in_dashboard(bob, feedback)
    feedback.refresh_from_db()
    assert feedback.status == FeedbackStatus.DISMISSED
    assert feedback.targets.count() == 1


def test_the_adapter_page_still_lists_dismissed_feedback(trace, bob, alice):
    feedback = feedback_by(trace, bob, text="Lead with the number.")
    trained_on(feedback)
    delete_in_dashboard(bob, feedback)
    client = Client()
    client.force_login(alice)
    html = client.get("/p/acme/adapters/1/").content.decode()
    assert "Lead with the number." in html and "1 target from 1 feedback item" in html
    assert "dismissed</span>" in html


def test_the_trace_page_marks_dismissed_feedback_and_offers_no_delete(trace, bob):
    feedback = feedback_by(trace, bob)
    trained_on(feedback)
    delete_in_dashboard(bob, feedback)
    client = Client()
    client.force_login(bob)
    html = client.get(f"/p/acme/traces/{trace.pk}/").content.decode()
    assert 'class="badge dismissed"' in html and "learned by" in html
    assert f"/feedback/{feedback.pk}/delete/" not in html


def test_feedback_no_run_used_is_deleted_with_its_targets(trace, bob):
    feedback = feedback_by(trace, bob)
    approved_target(feedback)  # proposed and approved, but never trained on
    delete_in_dashboard(bob, feedback)
    assert not Feedback.objects.exists() and not DistillationTarget.objects.exists()


def test_the_api_dismisses_feedback_an_adapter_learned_from(api, trace):
    feedback = sent_by(api)
    trained_on(feedback)
    response = api_delete(api, feedback)
    assert response.status_code == 200 and response.json()["status"] == "dismissed"
    shown = api.get("/api/v1/traces/t-1").json()["review"]["feedback"]
    assert [(item["status"], item["adapters"]) for item in shown] == [("dismissed", ["acme-v1"])]


def test_the_api_deletes_feedback_no_run_used(api, trace):
    feedback = sent_by(api)
    approved_target(feedback)
    assert api_delete(api, feedback).status_code == 204
    assert not Feedback.objects.exists() and not DistillationTarget.objects.exists()


def test_an_ingest_key_deletes_what_another_ingest_key_sent(api, project, trace):
    feedback = sent_by(ApiClient(create_api_key(project=project, name="harness-2")[1]))
    assert api_delete(api, feedback).status_code == 204
    assert not Feedback.objects.exists()


def test_an_ingest_key_cannot_delete_a_review_keys_correction(api, review_api, trace):
    """The attack: the harness's key removed a reviewer's correction and its approved target."""
    correction = sent_by(review_api, correction={"content": "Answer: 84."})
    approved_target(correction)
    response = api_delete(api, correction)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert "is a reviewer's" in response.json()["detail"]
    assert (
        "needs an API key with the review scope (this key has: ingest)"
        in (response.json()["detail"])
    )
    correction.refresh_from_db()
    assert correction.status == FeedbackStatus.OPEN
    assert correction.targets.get().state == TargetState.APPROVED


def test_a_review_key_deletes_a_reviewers_feedback(review_api, project, trace):
    feedback = sent_by(review_api, correction={"content": "Answer: 84."})
    approved_target(feedback)
    other_review_key = ApiClient(create_api_key(project=project, scopes=["review"])[1])
    assert api_delete(other_review_key, feedback).status_code == 204
    assert not Feedback.objects.exists() and not DistillationTarget.objects.exists()


def test_a_review_key_deletes_what_an_ingest_key_sent(api, review_api, trace):
    feedback = sent_by(api)
    assert api_delete(review_api, feedback).status_code == 204
    assert not Feedback.objects.exists()


def test_an_ingest_key_cannot_delete_feedback_whose_key_is_gone(api, project, trace):
    """Without its key nothing says an ingest key sent it: a reviewer decides."""
    gone, secret = create_api_key(project=project, name="old harness")
    feedback = sent_by(ApiClient(secret))
    gone.delete()
    response = api_delete(api, feedback)
    assert response.status_code == 403
    assert "records no key that sent it" in response.json()["detail"]
    assert Feedback.objects.filter(pk=feedback.pk).exists()


def test_no_key_deletes_feedback_a_person_wrote_in_the_dashboard(admin_api, trace, bob):
    reviewers = feedback_by(trace, bob)
    response = api_delete(admin_api, reviewers)
    assert response.status_code == 403
    assert "written by a person in the dashboard" in response.json()["detail"]
    assert Feedback.objects.filter(pk=reviewers.pk).exists()


def test_the_api_does_not_delete_another_projects_feedback(api, other_api, trace):
    feedback = sent_by(api)
    assert api_delete(other_api, feedback).status_code == 404
    assert Feedback.objects.filter(pk=feedback.pk).exists()


def test_a_plain_delete_cannot_cascade_to_targets(trace):
    """Whatever deletes feedback rows (admin, a script) cannot take a run's targets with them."""
    feedback = feedback_by(trace)
    trained_on(feedback)
    with pytest.raises(ProtectedError):
        Feedback.objects.filter(pk=feedback.pk).delete()
    assert DistillationTarget.objects.filter(feedback=feedback).exists()


def test_new_runs_leave_dismissed_feedback_out(project, trace, bob):
    feedback = feedback_by(trace, bob)
    trained_on(feedback)
    assert build_training_set(project=project).included == 1
    delete_in_dashboard(bob, feedback)
    training_set = build_training_set(project=project)
    assert training_set.included == 0
    assert training_set.excluded["feedback_dismissed"] == 1
