"""A feedback nothing usable came out of asks for a corrected turn, on the trace page and the
Retrain page; the correction becomes its target with no teacher."""

import pytest
from django.test import Client

from reviewapp import jobs
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.proposals import propose_targets_for
from reviewapp.projects.project_settings import update_settings
from reviewapp.review.feedback import mark_feedback_failed, record_feedback
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace

REASON = "none of the teacher's 16 revisions followed it (checks failed); write a corrected turn"


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


@pytest.fixture
def failed(trace):
    feedback, _ = record_feedback(trace=trace, text="Say the result first.", turn=4)
    mark_feedback_failed(feedback_id=feedback.pk, reason=REASON)
    return feedback


@pytest.fixture
def sent(enqueued):
    """The feedback ids sent to the targets task, read when asked."""
    return lambda: [feedback_id for (feedback_id,) in enqueued.of(jobs.PROPOSE_TARGETS)]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def correct_url(feedback) -> str:
    return f"/p/acme/traces/{feedback.trace_id}/feedback/{feedback.pk}/correct/"


def test_the_trace_page_asks_reviewers_for_a_corrected_turn(bob, victor, failed):
    page = f"/p/acme/traces/{failed.trace_id}/"
    html = logged_in(bob).get(page).content.decode()
    assert "No target came out of it, so a run would learn nothing from it" in html
    assert correct_url(failed) in html
    assert correct_url(failed) not in logged_in(victor).get(page).content.decode()


def test_the_retrain_page_says_so_and_links_each_to_its_correction(alice, failed):
    html = logged_in(alice).get("/p/acme/retrain/").content.decode()
    assert "1 feedback item could not be used" in html
    assert "a run would learn nothing from it" in html
    assert f'/p/acme/traces/{failed.trace_id}/#feedback-{failed.pk}">Write a corrected turn' in html


def test_a_correction_reopens_the_feedback_and_becomes_its_approved_target(
    bob, failed, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in(bob).post(
            correct_url(failed), {"correction": "84."}, headers={"HX-Request": "true"}
        )

    assert response.status_code == 200
    assert "The model could not use this feedback" not in response.content.decode()
    stored = Feedback.objects.get(pk=failed.pk)
    assert (stored.status, stored.failure_reason) == (FeedbackStatus.OPEN, "")
    assert stored.correction == {"role": "assistant", "content": "84."}
    assert sent() == [failed.pk]
    # The worker's task: a correction needs no teacher.
    assert propose_targets_for(feedback_id=failed.pk) == 1
    target = DistillationTarget.objects.get()
    assert (target.source, target.state, target.target["content"]) == (
        "correction",
        TargetState.APPROVED,
        "84.",
    )


def test_an_empty_correction_is_422_naming_it(bob, failed, sent):
    response = logged_in(bob).post(
        correct_url(failed), {"correction": "  "}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422
    assert "write the corrected turn" in response.content.decode()
    assert Feedback.objects.get(pk=failed.pk).status == FeedbackStatus.FAILED
    assert sent() == []


def test_a_correction_that_still_does_not_fit_the_context_is_422(bob, project, failed, sent):
    update_settings(project=project, changes={"training": {"max_seq_len": 8}})
    response = logged_in(bob).post(correct_url(failed), {"correction": "84."})
    assert response.status_code == 422
    assert "too long for the model&#x27;s context" in response.content.decode()
    assert Feedback.objects.get(pk=failed.pk).correction is None


def test_feedback_that_did_not_fail_is_not_corrected_here(bob, trace, sent):
    feedback, _ = record_feedback(trace=trace, text="Fine.", turn=4)
    response = logged_in(bob).post(correct_url(feedback), {"correction": "84."})
    assert response.status_code == 422
    assert Feedback.objects.get(pk=feedback.pk).correction is None


def test_viewers_and_other_projects_cannot_correct(victor, mallory, failed, sent):
    assert logged_in(victor).post(correct_url(failed), {"correction": "84."}).status_code == 403
    assert logged_in(mallory).post(correct_url(failed), {"correction": "84."}).status_code == 404
    assert Feedback.objects.get(pk=failed.pk).status == FeedbackStatus.FAILED
