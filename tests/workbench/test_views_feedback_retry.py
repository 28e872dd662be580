"""The trace page shows why a feedback failed; an admin's Retry reopens it and asks for targets."""

import pytest
from django.test import Client

from reviewapp import jobs
from reviewapp.projects.project_settings import update_settings
from reviewapp.review.feedback import mark_feedback_failed, record_feedback
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


@pytest.fixture
def failed(trace):
    feedback, _ = record_feedback(trace=trace, text="Say the result first.", turn=4)
    mark_feedback_failed(feedback_id=feedback.pk, reason="the teacher answered HTTP 400")
    return feedback


@pytest.fixture
def sent(enqueued):
    """The feedback ids sent to the targets task, read when asked."""
    return lambda: [feedback_id for (feedback_id,) in enqueued.of(jobs.PROPOSE_TARGETS)]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def retry_url(feedback) -> str:
    return f"/p/acme/traces/{feedback.trace_id}/feedback/{feedback.pk}/retry/"


def test_it_shows_the_failure_reason_next_to_the_feedback(bob, failed):
    html = logged_in(bob).get(f"/p/acme/traces/{failed.trace_id}/").content.decode()
    assert "The model could not use this feedback: the teacher answered HTTP 400" in html


def test_it_shows_the_retry_button_to_admins_only(alice, bob, failed):
    page = f"/p/acme/traces/{failed.trace_id}/"
    assert retry_url(failed) in logged_in(alice).get(page).content.decode()
    assert retry_url(failed) not in logged_in(bob).get(page).content.decode()


def test_it_reopens_the_feedback_and_asks_for_targets(
    alice, failed, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in(alice).post(retry_url(failed))
    assert response.status_code == 302
    stored = Feedback.objects.get(pk=failed.pk)
    assert (stored.status, stored.failure_reason) == (FeedbackStatus.OPEN, "")
    assert sent() == [failed.pk]


def test_it_keeps_feedback_failed_while_it_still_does_not_fit(
    alice, failed, sent, project, django_capture_on_commit_callbacks
):
    update_settings(project=project, changes={"training": {"max_seq_len": 8}})
    with django_capture_on_commit_callbacks(execute=True):
        logged_in(alice).post(retry_url(failed))
    stored = Feedback.objects.get(pk=failed.pk)
    assert stored.status == FeedbackStatus.FAILED
    assert "too long for the model's context" in stored.failure_reason
    assert sent() == []


def test_it_forbids_reviewers(bob, failed, sent):
    assert logged_in(bob).post(retry_url(failed)).status_code == 403
    assert Feedback.objects.get(pk=failed.pk).status == FeedbackStatus.FAILED


def test_it_hides_other_projects(mallory, failed, sent):
    assert logged_in(mallory).post(retry_url(failed)).status_code == 404
    assert Feedback.objects.get(pk=failed.pk).status == FeedbackStatus.FAILED
