"""The first-run checklist on the trace list: each step ticked from what the database holds,
gone once every step is done."""

import re

import pytest
from django.test import Client

from reviewapp.learning.models import TrainingRun
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import QueueReview, ReviewStatus
from reviewapp.review.queues import build_queue
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace


def steps_done(user) -> dict[str, bool] | None:
    """Each step of the checklist on the trace list and whether it is ticked; None: no list."""
    client = Client()
    client.force_login(user)
    html = client.get("/p/acme/traces/").content.decode()
    if 'id="first-run"' not in html:
        return None
    steps = re.findall(r'<li class="(done)?" id="first-run-(\w+)">', html)
    return {key: done == "done" for done, key in steps}


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


def test_an_empty_project_shows_every_step_to_do(project, bob):
    assert steps_done(bob) == {
        "sent": False,
        "reviewed": False,
        "wrote": False,
        "retrained": False,
    }


def test_each_step_is_ticked_as_it_is_done(project, trace, bob, enqueued):
    assert steps_done(bob) == {"sent": True, "reviewed": False, "wrote": False, "retrained": False}

    TraceTag.objects.create(trace=trace, tag=Tag.objects.create(project=project, name="slow"))
    assert steps_done(bob)["reviewed"] is False  # a machine's tag is no review
    TraceTag.objects.create(trace=trace, tag=Tag.objects.get(), reviewer=bob)
    assert steps_done(bob)["reviewed"] is True

    record_feedback(trace=trace, turn=4, text="Begin with 'Answer:'.", reviewer=bob)
    assert steps_done(bob)["wrote"] is True


def test_a_finished_queue_review_counts_as_reviewing_one(project, trace, alice, bob):
    queue = build_queue(
        project=project, name="Weekly", filters={}, filter_query="", sample_size=None,
        seed=None, reviewers_per_item=1, blind=False, assignees=[], created_by=alice,
    )  # fmt: skip
    review = QueueReview.objects.create(
        item=queue.items.get(), reviewer=bob, reserved_until=trace.received_at
    )
    assert steps_done(bob)["reviewed"] is False  # reserved is not reviewed
    review.status = ReviewStatus.DONE
    review.save()

    assert steps_done(bob)["reviewed"] is True


def test_the_checklist_goes_once_every_step_is_done(project, trace, bob, enqueued):
    TraceTag.objects.create(
        trace=trace, tag=Tag.objects.create(project=project, name="x"), reviewer=bob
    )
    record_feedback(trace=trace, turn=4, text="Begin with 'Answer:'.", reviewer=bob)
    assert steps_done(bob) == {"sent": True, "reviewed": True, "wrote": True, "retrained": False}

    TrainingRun.objects.create(project=project, config={})

    assert steps_done(bob) is None


def test_another_projects_work_ticks_nothing_here(project, other_project, bob, enqueued):
    ingest_traces(project=other_project, raw_items=[make_trace("t-1")])
    TrainingRun.objects.create(project=other_project, config={})

    assert steps_done(bob) == {"sent": False, "reviewed": False, "wrote": False, "retrained": False}
