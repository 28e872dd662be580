"""Targets for one feedback, with the teacher a real HTTP server (a fake model upstream)."""

import pytest
from django.test import Client

from reviewapp.learning.targets import propose_targets_for
from reviewapp.models import DistillationTarget, Feedback, FeedbackStatus
from reviewapp.project_settings import update_settings
from reviewapp.services.feedback import record_feedback
from reviewapp.services.ingest import ingest_traces
from tests.factories import make_trace
from tests.fake_upstream import FakeUpstream


@pytest.fixture(scope="module")
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


def _teacher(project, upstream, model: str) -> None:
    update_settings(project=project, changes={"teacher": {"url": upstream.url, "model": model}})


def test_a_teacher_that_refuses_the_feedback_marks_it_failed_with_the_reason(
    project, trace, upstream
):
    _teacher(project, upstream, "broken-model")  # the fake answers 500
    feedback, _ = record_feedback(trace=trace, text="Lead with the number.", turn=4)

    assert propose_targets_for(feedback_id=feedback.pk) == 0

    feedback.refresh_from_db()
    assert feedback.status == FeedbackStatus.FAILED
    assert "HTTP 500" in feedback.failure_reason
    assert not DistillationTarget.objects.exists()


def test_no_revision_that_follows_the_feedback_asks_for_a_corrected_turn(project, trace, upstream):
    _teacher(project, upstream, "fake")  # it echoes the question: never "Answer: ..."
    feedback, _ = record_feedback(
        trace=trace,
        text="Begin with 'Answer:'.",
        turn=4,
        checks=[{"kind": "regex", "value": "^Answer:"}],
    )

    propose_targets_for(feedback_id=feedback.pk)

    feedback.refresh_from_db()
    assert feedback.status == FeedbackStatus.FAILED
    assert "write a corrected turn" in feedback.failure_reason


def test_the_configured_teacher_writes_the_revisions(project, trace, upstream):
    _teacher(project, upstream, "fake")
    feedback, _ = record_feedback(trace=trace, text="Lead with the number.", turn=4)

    assert propose_targets_for(feedback_id=feedback.pk) == 1

    [target] = DistillationTarget.objects.all()
    assert (target.state, target.target["content"]) == ("proposed", "echo: What is 12 * 7?")
    sent = upstream.requests[-1]["body"]
    assert "Lead with the number." in str(sent["messages"])  # the teacher was shown the feedback
    assert sent["model"] == "fake"
    assert Feedback.objects.get().status == FeedbackStatus.USED


def test_the_retrain_page_names_feedback_that_could_not_be_used(project, trace, upstream, alice):
    _teacher(project, upstream, "broken-model")
    feedback, _ = record_feedback(trace=trace, text="Lead with the number.", turn=4)
    propose_targets_for(feedback_id=feedback.pk)
    client = Client()
    client.force_login(alice)

    page = client.get(f"/p/{project.slug}/retrain/").content.decode()

    assert "1 feedback item could not be used" in page
    assert "the teacher answered HTTP 500" in page
