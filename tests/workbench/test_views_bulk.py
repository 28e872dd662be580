"""Bulk actions on the trace list: a tag, a queue or one feedback for every ticked trace."""

import pytest
from django.test import Client

from reviewapp.review import feedback as feedback_service
from reviewapp.review.feedback import FeedbackError
from reviewapp.review.models import Feedback, Queue, QueueItem
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace

TAG = "/p/acme/traces/bulk/tag/"
QUEUE = "/p/acme/traces/bulk/queue/"
FEEDBACK = "/p/acme/traces/bulk/feedback/"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def traces(project) -> list:
    ingest_traces(project=project, raw_items=[make_trace(f"t-{i}") for i in range(3)])
    return list(project.traces.order_by("external_id"))


@pytest.fixture
def slow(project) -> Tag:
    return Tag.objects.create(project=project, name="slow")


@pytest.fixture
def weekly(project, alice, traces) -> Queue:
    """A queue already holding the first trace."""
    queue = Queue.objects.create(project=project, name="Weekly", created_by=alice)
    QueueItem.objects.create(queue=queue, trace=traces[0], position=1)
    return queue


@pytest.fixture
def foreign_trace(other_project):
    ingest_traces(project=other_project, raw_items=[make_trace("theirs")])
    return other_project.traces.get()


def ticked(*traces, **fields) -> dict:
    return {"trace": [str(trace.pk) for trace in traces], **fields}


def test_a_reviewer_tags_every_ticked_trace(bob, traces, slow):
    response = logged_in(bob).post(
        TAG, ticked(traces[0], traces[1], **{"bulk-tag": slow.pk, "filters": "q=12"})
    )
    assert response.status_code == 302 and response["Location"] == "/p/acme/traces/?q=12"
    tagged = TraceTag.objects.filter(tag=slow, reviewer=bob).values_list("trace", flat=True)
    assert set(tagged) == {traces[0].pk, traces[1].pk}


def test_the_list_says_how_many_traces_were_tagged(bob, traces, slow):
    client = logged_in(bob)
    client.post(TAG, ticked(traces[0], **{"bulk-tag": slow.pk}))
    response = client.post(TAG, ticked(*traces, **{"bulk-tag": slow.pk}), follow=True)
    assert "Tagged 3 traces “slow” (1 had it from you already)." in response.content.decode()


def test_an_admin_appends_ticked_traces_to_a_queue(alice, traces, weekly):
    response = logged_in(alice).post(
        QUEUE, ticked(*traces, **{"bulk-queue": weekly.pk}), follow=True
    )
    positions = dict(weekly.items.values_list("trace_id", "position"))
    assert positions == {traces[0].pk: 1, traces[2].pk: 2, traces[1].pk: 3}  # newest first
    html = response.content.decode()
    assert "Put 3 traces in the queue “Weekly” (1 were in it already and kept their place)." in html


def test_a_reviewer_cannot_fill_a_queue(bob, traces, weekly):
    response = logged_in(bob).post(QUEUE, ticked(traces[1], **{"bulk-queue": weekly.pk}))
    assert response.status_code == 403
    assert weekly.items.count() == 1


def test_a_reviewer_writes_one_feedback_on_every_ticked_trace(bob, traces):
    response = logged_in(bob).post(
        FEEDBACK, ticked(traces[0], traces[2], **{"bulk-text": "Show the working."}), follow=True
    )
    rows = Feedback.objects.values_list("trace_id", "turn", "reviewer", "text")
    assert set(rows) == {
        (traces[0].pk, None, bob.pk, "Show the working."),
        (traces[2].pk, None, bob.pk, "Show the working."),
    }
    assert "Wrote the feedback on 2 traces." in response.content.decode()


def test_feedback_on_many_traces_is_written_on_all_or_none(bob, traces, monkeypatch):
    record = feedback_service.record_feedback
    calls = []

    def fails_on_the_second(**kwargs):
        calls.append(kwargs["trace"])
        if len(calls) == 2:
            raise FeedbackError("text: the model cannot read this")
        return record(**kwargs)

    monkeypatch.setattr(feedback_service, "record_feedback", fails_on_the_second)
    response = logged_in(bob).post(FEEDBACK, ticked(*traces, **{"bulk-text": "Shorter."}))
    assert response.status_code == 422
    assert "the model cannot read this" in response.content.decode()
    assert not Feedback.objects.exists()


def test_no_ticked_trace_is_a_422_naming_the_problem(bob, traces, slow):
    for url, fields in ((TAG, {"bulk-tag": slow.pk}), (FEEDBACK, {"bulk-text": "Shorter."})):
        response = logged_in(bob).post(url, fields)
        assert response.status_code == 422, url
        assert "No traces selected" in response.content.decode()
    assert not TraceTag.objects.exists() and not Feedback.objects.exists()


def test_a_refused_action_shows_the_list_with_the_ticks_kept(bob, traces):
    response = logged_in(bob).post(TAG, ticked(traces[1]))  # no tag chosen
    assert response.status_code == 422
    html = response.content.decode()
    assert "Choose the tag to add." in html
    assert f'value="{traces[1].pk}" form="bulk-actions" checked>' in html
    assert f'value="{traces[0].pk}" form="bulk-actions">' in html


def test_a_trace_of_another_project_is_404_and_nothing_changes(bob, traces, slow, foreign_trace):
    client = logged_in(bob)
    response = client.post(TAG, ticked(traces[0], foreign_trace, **{"bulk-tag": slow.pk}))
    assert response.status_code == 404
    response = client.post(FEEDBACK, ticked(foreign_trace, **{"bulk-text": "Shorter."}))
    assert response.status_code == 404
    assert not TraceTag.objects.exists() and not Feedback.objects.exists()


def test_a_tag_of_another_project_is_refused(bob, traces, other_project):
    theirs = Tag.objects.create(project=other_project, name="theirs")
    response = logged_in(bob).post(TAG, ticked(traces[0], **{"bulk-tag": theirs.pk}))
    assert response.status_code == 422
    assert not TraceTag.objects.exists()


def test_a_member_of_another_project_gets_404(mallory, traces, slow):
    response = logged_in(mallory).post(TAG, ticked(traces[0], **{"bulk-tag": slow.pk}))
    assert response.status_code == 404


def test_a_viewer_cannot_tag_or_write_feedback(victor, traces, slow):
    client = logged_in(victor)
    assert client.post(TAG, ticked(traces[0], **{"bulk-tag": slow.pk})).status_code == 403
    assert client.post(FEEDBACK, ticked(traces[0], **{"bulk-text": "x"})).status_code == 403
    assert not TraceTag.objects.exists() and not Feedback.objects.exists()


def test_the_list_offers_boxes_to_reviewers_and_the_queue_to_admins(alice, bob, victor, traces):
    admin = logged_in(alice).get("/p/acme/traces/").content.decode()
    reviewer = logged_in(bob).get("/p/acme/traces/").content.decode()
    viewer = logged_in(victor).get("/p/acme/traces/").content.decode()
    assert 'data-select-all="bulk-actions"' in reviewer and 'name="trace"' in reviewer
    assert 'formaction="/p/acme/traces/bulk/queue/"' in admin
    assert 'formaction="/p/acme/traces/bulk/queue/"' not in reviewer
    assert 'id="bulk-actions"' not in viewer and 'name="trace"' not in viewer


def test_a_queue_that_would_overflow_takes_none_of_them(alice, traces, weekly, monkeypatch):
    monkeypatch.setattr("reviewapp.review.queues.MAX_QUEUE_ITEMS", 2)
    response = logged_in(alice).post(QUEUE, ticked(*traces, **{"bulk-queue": weekly.pk}))
    assert response.status_code == 422
    assert "“Weekly” holds 1 of the 2 traces a queue can; 2 more would not fit" in (
        response.content.decode()
    )
    assert weekly.items.count() == 1
