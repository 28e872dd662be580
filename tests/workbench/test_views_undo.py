"""Undo on the trace page: a deleted feedback and a tag taken off come back exactly as they were,
only for the reviewer who removed them and only for a while; copies say where they came from."""

import re
from datetime import timedelta

import pytest
from django.core import serializers
from django.test import Client
from django.utils import timezone

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.review.feedback import UNDO_SECONDS, record_feedback
from reviewapp.review.models import CopiedFeedback, DeletedFeedback, Feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace

HTMX = {"HX-Request": "true"}


@pytest.fixture
def traces(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1"), make_trace("t-2")])
    return {trace.external_id: trace for trace in project.traces.all()}


@pytest.fixture
def trace(traces):
    return traces["t-1"]


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def undo_token(response) -> str:
    return re.search(r'name="token" value="([^"]+)"', response.content.decode()).group(1)


def rows_of(feedback_id: int) -> list[dict]:
    """The feedback, its targets and its copy link as Django serializes them: every field."""
    feedback = Feedback.objects.get(pk=feedback_id)
    rows = [feedback, *DistillationTarget.objects.filter(feedback=feedback).order_by("pk")]
    rows += CopiedFeedback.objects.filter(feedback=feedback)
    return serializers.serialize("python", rows)


@pytest.fixture
def copied_feedback(traces, bob):
    """Feedback on t-2 that "apply to similar" copied from bob's feedback on t-1, with a
    target a reviewer approved."""
    source = record_feedback(trace=traces["t-1"], turn=4, text="Say 'Answer:'.", reviewer=bob)[0]
    copy = record_feedback(trace=traces["t-2"], text="Say 'Answer:'.", rating=0.5, reviewer=bob)[0]
    CopiedFeedback.objects.create(feedback=copy, source=source, similarity=0.93, confirmed_by=bob)
    DistillationTarget.objects.create(
        feedback=copy, turn=4, source="hint", student_context=[{"role": "user", "content": "q"}],
        target={"role": "assistant", "content": "Answer: 84."}, state=TargetState.APPROVED,
        reviewed_by=bob,
    )  # fmt: skip
    return copy


def delete(client, feedback):
    url = f"/p/acme/traces/{feedback.trace_id}/feedback/{feedback.pk}/delete/"
    return client.post(url, headers=HTMX)


def test_undo_puts_a_deleted_feedback_back_exactly_as_it_was(copied_feedback, bob, enqueued):
    before = rows_of(copied_feedback.pk)
    client = client_for(bob)

    response = delete(client, copied_feedback)

    assert not Feedback.objects.filter(pk=copied_feedback.pk).exists()
    deleted = DeletedFeedback.objects.get()
    undo_url = f"/p/acme/traces/{copied_feedback.trace_id}/feedback/undo/{deleted.pk}/"
    assert undo_url in response.content.decode()
    response = client.post(undo_url, headers=HTMX)
    assert response.status_code == 200
    assert rows_of(copied_feedback.pk) == before
    assert not DeletedFeedback.objects.exists()
    assert f'id="feedback-{copied_feedback.pk}"' in response.content.decode()


def test_undo_relinks_the_copies_made_from_a_deleted_feedback(copied_feedback, bob, enqueued):
    source = copied_feedback.copied_from.source
    client = client_for(bob)
    delete(client, source)
    assert CopiedFeedback.objects.get(feedback=copied_feedback).source is None

    client.post(
        f"/p/acme/traces/{source.trace_id}/feedback/undo/{DeletedFeedback.objects.get().pk}/"
    )

    assert CopiedFeedback.objects.get(feedback=copied_feedback).source_id == source.pk


def test_another_reviewer_cannot_undo_a_delete(copied_feedback, bob, alice, enqueued):
    delete(client_for(bob), copied_feedback)
    deleted = DeletedFeedback.objects.get()

    response = client_for(alice).post(
        f"/p/acme/traces/{copied_feedback.trace_id}/feedback/undo/{deleted.pk}/"
    )

    assert response.status_code == 404
    assert not Feedback.objects.filter(pk=copied_feedback.pk).exists()


def test_an_undo_too_late_says_so_and_restores_nothing(copied_feedback, bob, enqueued):
    client = client_for(bob)
    delete(client, copied_feedback)
    deleted = DeletedFeedback.objects.get()
    deleted.deleted_at = timezone.now() - timedelta(seconds=UNDO_SECONDS + 1)
    deleted.save()

    response = client.post(
        f"/p/acme/traces/{copied_feedback.trace_id}/feedback/undo/{deleted.pk}/", headers=HTMX
    )

    assert "Too late to undo" in response.content.decode()
    assert not Feedback.objects.filter(pk=copied_feedback.pk).exists()


def test_feedback_written_again_since_the_delete_is_not_doubled_by_undo(trace, bob, enqueued):
    feedback = record_feedback(trace=trace, turn=4, text="Be brief.", reviewer=bob)[0]
    client = client_for(bob)
    delete(client, feedback)
    again = record_feedback(trace=trace, turn=4, text="Be brief.", reviewer=bob)[0]

    response = client.post(
        f"/p/acme/traces/{trace.pk}/feedback/undo/{DeletedFeedback.objects.get().pk}/",
        headers=HTMX,
    )

    assert "written again" in response.content.decode()
    assert list(trace.feedback.values_list("pk", flat=True)) == [again.pk]


def test_a_copy_says_which_trace_it_was_copied_from(copied_feedback, bob, traces):
    response = client_for(bob).get(f"/p/acme/traces/{traces['t-2'].pk}/")

    text = response.content.decode()
    source = copied_feedback.copied_from.source
    assert "copied from" in text
    assert f'href="/p/acme/traces/{traces["t-1"].pk}/#feedback-{source.pk}">t-1</a>' in text
    assert "similarity 0.93" in text


def test_feedback_written_on_the_trace_itself_says_nothing_of_copies(trace, bob):
    record_feedback(trace=trace, turn=4, text="Be brief.", reviewer=bob)

    response = client_for(bob).get(f"/p/acme/traces/{trace.pk}/")

    assert "copied from" not in response.content.decode()


def test_saved_feedback_is_marked_for_the_page_to_scroll_to_with_its_turn(trace, bob, enqueued):
    response = client_for(bob).post(
        f"/p/acme/traces/{trace.pk}/feedback/",
        {"anchor": "turn:4", "text": "Begin with 'Answer:'."},
        headers=HTMX,
    )

    feedback = trace.feedback.get()
    text = response.content.decode()
    assert 'data-saved-turn="4"' in text
    assert f'id="feedback-{feedback.pk}" tabindex="-1" data-saved' in text


def test_taking_a_tag_off_offers_an_undo_that_puts_it_back_as_it_was(trace, bob):
    tag = Tag.objects.create(project=trace.project, name="slow")
    first_on = timezone.now() - timedelta(days=3)
    TraceTag.objects.create(trace=trace, tag=tag, reviewer=bob, created_at=first_on)
    client = client_for(bob)

    response = client.post(f"/p/acme/traces/{trace.pk}/tags/{tag.pk}/", headers=HTMX)
    assert not TraceTag.objects.exists()
    assert "Took off slow." in response.content.decode()
    token = undo_token(response)
    client.post(f"/p/acme/traces/{trace.pk}/tags/undo/", {"token": token}, headers=HTMX)

    restored = TraceTag.objects.get()
    assert (restored.tag, restored.reviewer, restored.created_at) == (tag, bob, first_on)


def test_a_tag_undo_is_only_its_reviewers(trace, bob, alice):
    tag = Tag.objects.create(project=trace.project, name="slow")
    TraceTag.objects.create(trace=trace, tag=tag, reviewer=bob)
    response = client_for(bob).post(f"/p/acme/traces/{trace.pk}/tags/{tag.pk}/", headers=HTMX)

    response = client_for(alice).post(
        f"/p/acme/traces/{trace.pk}/tags/undo/", {"token": undo_token(response)}
    )

    assert response.status_code == 400
    assert not TraceTag.objects.exists()


def test_a_tag_undo_does_not_apply_to_another_trace(traces, bob):
    tag = Tag.objects.create(project=traces["t-1"].project, name="slow")
    TraceTag.objects.create(trace=traces["t-1"], tag=tag, reviewer=bob)
    client = client_for(bob)
    response = client.post(f"/p/acme/traces/{traces['t-1'].pk}/tags/{tag.pk}/", headers=HTMX)

    response = client.post(
        f"/p/acme/traces/{traces['t-2'].pk}/tags/undo/",
        {"token": undo_token(response)},
    )

    assert response.status_code == 400
    assert not TraceTag.objects.exists()
