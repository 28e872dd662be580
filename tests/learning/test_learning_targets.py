"""Targets for one feedback, with the teacher a real HTTP server (a fake model upstream)."""

import pytest
from django.test import Client

from reviewapp.learning.models import DistillationTarget
from reviewapp.learning.proposals import (
    WORKED_EXAMPLE_CHARS,
    propose_targets_for,
    worked_examples_for,
)
from reviewapp.projects.project_settings import update_settings
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.ingest import ingest_traces
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


@pytest.fixture(autouse=True)
def operator_offers_the_teacher(settings, upstream):
    settings.TEACHER_SERVERS = [upstream.url]


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


def _corrected_elsewhere(project, text: str, answer: str):
    """The same feedback on another trace, with a reviewer's corrected answer."""
    ingest_traces(project=project, raw_items=[make_trace("t-2")])
    other = project.traces.get(external_id="t-2")
    feedback, _ = record_feedback(
        trace=other, text=text, turn=4, correction={"role": "assistant", "content": answer}
    )
    return feedback


def test_the_teacher_is_shown_reviewers_corrections_under_the_same_feedback(
    project, trace, upstream
):
    _teacher(project, upstream, "fake")
    _corrected_elsewhere(project, "Lead with the number.", "84. Twelve sevens.")
    record_feedback(
        trace=project.traces.get(external_id="t-2"),
        text="Be brief.",
        turn=4,
        correction={"role": "assistant", "content": "84, briefly."},
    )
    feedback, _ = record_feedback(trace=trace, text="lead with the number. ", turn=4)

    propose_targets_for(feedback_id=feedback.pk)

    shown = str(upstream.requests[-1]["body"]["messages"])
    assert "84. Twelve sevens." in shown  # same words, case and spaces aside
    assert "84, briefly." not in shown  # another feedback's correction is not
    [target] = DistillationTarget.objects.filter(feedback=feedback)
    assert "84. Twelve sevens." in str(target.teacher_context)  # distill mode sees them too


def test_a_reviewers_corrected_tool_call_is_shown_to_the_teacher_as_a_call(
    project, trace, upstream
):
    """Feedback on the agent's first step (call the calculator, with the whole expression):
    the reviewer's correction elsewhere is a tool call, shown after its question as the call
    it is, so the teacher sees the action to copy rather than nothing."""
    _teacher(project, upstream, "fake")
    ingest_traces(project=project, raw_items=[make_trace("t-2")])
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "(12 * 7) + 1"}'},
            }
        ],
    }
    record_feedback(
        trace=project.traces.get(external_id="t-2"),
        text="Pass the whole expression.",
        turn=2,
        correction=call,
    )
    feedback, _ = record_feedback(trace=trace, text="Pass the whole expression.", turn=2)

    propose_targets_for(feedback_id=feedback.pk)

    shown = upstream.requests[-1]["body"]["messages"]
    assert call in shown
    assert shown[shown.index(call) - 1]["content"].startswith("What is 12 * 7?")


def test_worked_examples_leave_room_for_the_trace_in_the_teachers_context(project, trace):
    _corrected_elsewhere(project, "Explain more.", "word " * (WORKED_EXAMPLE_CHARS // 5 + 1))
    feedback, _ = record_feedback(trace=trace, text="Explain more.", turn=4)

    assert worked_examples_for(feedback) == []  # one over the budget is not shown at all


def test_a_reviewers_correction_reopens_feedback_of_the_same_text_the_teacher_failed(
    project, trace, upstream
):
    _teacher(project, upstream, "fake")  # it echoes the question: never "Answer: ..."
    failed, _ = record_feedback(
        trace=trace,
        text="Begin with 'Answer:'.",
        turn=4,
        checks=[{"kind": "regex", "value": "^Answer:"}],
    )
    propose_targets_for(feedback_id=failed.pk)
    failed.refresh_from_db()
    assert failed.status == FeedbackStatus.FAILED

    _corrected_elsewhere(project, "Begin with 'Answer:'.", "Answer: 84.")

    failed.refresh_from_db()
    assert (failed.status, failed.failure_reason) == (FeedbackStatus.OPEN, "")


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
