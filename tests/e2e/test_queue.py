import pytest
from playwright.sync_api import expect

from reviewapp.review.models import QueueReview, ReviewStatus
from reviewapp.review.queues import build_queue
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace

pytestmark = pytest.mark.slow


@pytest.fixture
def queue(project, bob):
    ingest_traces(project=project, raw_items=[make_trace(f"t-{i}") for i in range(3)])
    return build_queue(
        project=project,
        name="Calculator mistakes",
        filters={},
        filter_query="",
        sample_size=None,
        seed=None,
        reviewers_per_item=1,
        blind=False,
        assignees=[],
        created_by=bob,
    )


def test_done_next_finishes_the_item_and_opens_the_next_ones_trace(bob_page, bob, queue):
    page = bob_page
    first, second = queue.items.order_by("position")[:2]
    page.goto(f"/p/acme/queues/{queue.pk}/")
    page.get_by_role("button", name="Start reviewing").click()
    page.wait_for_url(f"**/p/acme/traces/{first.trace_id}/?queue={queue.pk}&item={first.pk}")
    expect(page.locator(".trace-head h1")).to_have_text(first.trace.external_id)

    page.locator("#done-next").click()

    page.wait_for_url(f"**/p/acme/traces/{second.trace_id}/?queue={queue.pk}&item={second.pk}")
    expect(page.locator(".trace-head h1")).to_have_text(second.trace.external_id)
    expect(page.locator("#queue-bar")).to_contain_text("item 2 of 3")
    assert QueueReview.objects.get(item=first, reviewer=bob).status == ReviewStatus.DONE
    assert QueueReview.objects.get(item=second, reviewer=bob).status == ReviewStatus.RESERVED
