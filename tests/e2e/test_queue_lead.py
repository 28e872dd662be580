"""A lead's view of a queue in the browser: the items and who holds them, a release, the
progress bar drawn with its value, at a phone's width and a wide screen's."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import Browser, expect

from reviewapp.projects.models import Membership
from reviewapp.review.models import QueueReview
from reviewapp.review.queues import build_queue, finish_item, reserve_next_item
from reviewapp.traces.ingest import ingest_traces
from tests.e2e.conftest import TIMEOUT_MS, sign_in
from tests.factories import make_trace

pytestmark = pytest.mark.slow

# For a failure's message: the elements reaching past the window's right edge.
WIDER_THAN_THE_WINDOW = """[...document.querySelectorAll('body *')]
  .filter(element => element.getBoundingClientRect().right > innerWidth)
  .map(element => element.tagName + '.' + element.className).slice(0, 12)"""


@pytest.fixture
def queue(project, alice, bob):
    """Two reviewers per item over four traces: bob finished item 1, alice holds item 2."""
    carol = get_user_model().objects.create_user("carol", password="correct horse battery")
    Membership.objects.create(project=project, user=carol, role="reviewer")
    ingest_traces(project=project, raw_items=[make_trace(f"t-{i}") for i in range(4)])
    queue = build_queue(
        project=project, name="Two pairs of eyes", filters={"sort": "oldest"}, filter_query="",
        sample_size=None, seed=None, reviewers_per_item=2, blind=False, assignees=[],
        created_by=alice,
    )  # fmt: skip
    queue.guidelines = "Check the <b>arithmetic</b> first."
    queue.save()
    finish_item(item=reserve_next_item(queue=queue, reviewer=bob), reviewer=bob)
    reserve_next_item(queue=queue, reviewer=carol)
    return queue


@pytest.mark.parametrize("width", [390, 1440])
def test_a_lead_sees_the_progress_and_releases_a_held_item(
    browser: Browser, live_server, alice, queue, width
):
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": 844}
    )
    context.set_default_timeout(TIMEOUT_MS)
    sign_in(context, alice, live_server)
    page = context.new_page()
    page.goto(f"/p/acme/queues/{queue.pk}/")

    bar = page.locator("#queue-progress-bar")
    # Bob's one review and carol's hold on item 1: one of the eight reviews done.
    assert bar.evaluate("bar => bar.position") == pytest.approx(1 / 8)
    assert bar.bounding_box()["width"] >= 80
    for reviewer_bar in page.locator("#queue-progress td progress").all():
        assert reviewer_bar.bounding_box()["width"] >= 80
    assert page.evaluate("document.documentElement.scrollWidth") <= width, page.evaluate(
        WIDER_THAN_THE_WINDOW
    )

    first = queue.items.get(position=1)
    row = page.locator(f"#item-{first.pk}")
    expect(row).to_contain_text("carol · until")
    row.get_by_role("button", name="release").click()
    expect(page.locator(f"#item-{first.pk} .holder")).to_have_count(0)
    assert not QueueReview.objects.filter(item=first, reviewer__username="carol").exists()
    expect(page.locator("#guidelines")).to_contain_text("Check the <b>arithmetic</b> first.")
    context.close()
