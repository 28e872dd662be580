"""Feedback the model cannot use is marked failed with the reason, and counted for the Retrain
page (review/feedback.py, review/feedback_health.py)."""

import pytest

from reviewapp import jobs
from reviewapp.projects.project_settings import update_settings
from reviewapp.review.feedback import mark_feedback_failed, record_feedback
from reviewapp.review.feedback_health import unusable_feedback
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


@pytest.fixture
def small_context(project):
    """A model that trains on 64 tokens: the sample trace (~120 characters) plus a long feedback
    does not fit."""
    update_settings(project=project, changes={"training": {"max_seq_len": 64}})


def test_feedback_too_long_for_the_context_is_failed_with_the_reason(trace, small_context):
    feedback, _ = record_feedback(trace=trace, text="Say the result first. " * 10, turn=4)
    stored = Feedback.objects.get(pk=feedback.pk)
    assert stored.status == FeedbackStatus.FAILED
    assert "too long for the model's context" in stored.failure_reason
    assert "over the 64 the model trains on" in stored.failure_reason


def test_feedback_too_long_asks_no_worker_for_targets(
    trace, small_context, django_capture_on_commit_callbacks, enqueued
):
    with django_capture_on_commit_callbacks(execute=True):
        record_feedback(trace=trace, text="Say the result first. " * 10, turn=4)
    assert enqueued.of(jobs.PROPOSE_TARGETS) == []


def test_feedback_that_fits_stays_open(trace):
    feedback, _ = record_feedback(trace=trace, text="Say the result first.", turn=4)
    assert Feedback.objects.get(pk=feedback.pk).status == FeedbackStatus.OPEN


def test_a_teacher_failure_marks_open_feedback_failed(trace):
    feedback, _ = record_feedback(trace=trace, text="Say the result first.", turn=4)
    assert mark_feedback_failed(feedback_id=feedback.pk, reason="the teacher answered HTTP 400")
    stored = Feedback.objects.get(pk=feedback.pk)
    assert (stored.status, stored.failure_reason) == ("failed", "the teacher answered HTTP 400")


def test_used_feedback_is_not_marked_failed(trace):
    feedback, _ = record_feedback(trace=trace, text="Say the result first.", turn=4)
    Feedback.objects.filter(pk=feedback.pk).update(status=FeedbackStatus.USED)
    assert not mark_feedback_failed(feedback_id=feedback.pk, reason="late teacher error")
    assert Feedback.objects.get(pk=feedback.pk).status == FeedbackStatus.USED


def test_the_retrain_page_count_names_the_failed_items_and_reasons(trace, other_project):
    first, _ = record_feedback(trace=trace, text="Say the result first.", turn=4)
    second, _ = record_feedback(trace=trace, text="Be brief.", turn=4)
    record_feedback(trace=trace, text="Fine as is.", turn=4)
    mark_feedback_failed(feedback_id=first.pk, reason="the teacher answered HTTP 400")
    mark_feedback_failed(feedback_id=second.pk, reason="the teacher answered HTTP 500")
    unusable = unusable_feedback(project=trace.project)
    assert unusable.count == 2
    assert [(item.pk, item.failure_reason) for item in unusable.examples] == [
        (second.pk, "the teacher answered HTTP 500"),
        (first.pk, "the teacher answered HTTP 400"),
    ]
    assert not unusable_feedback(project=other_project)
