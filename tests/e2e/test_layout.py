"""The dashboard from a phone (390 px) to a wide screen (1440 px): nothing wider than the
window, the conversation before the sidebar, the navigation in a menu on a phone, the queue's
"Done, next" on screen."""

import pytest
from playwright.sync_api import Browser, expect

from reviewapp.review.queues import build_queue, reserve_next_item
from reviewapp.traces.ingest import ingest_traces
from tests.e2e.conftest import TIMEOUT_MS, sign_in
from tests.factories import make_trace

pytestmark = pytest.mark.slow

PHONE, WIDE = 390, 1440
# An id as harnesses send them: long, with few places to break.
LONG_ID = "support-episode-2026-12-03T07:41:12.443Z-7f3c2a9e1b4d4c8f9a0e"


@pytest.fixture
def pages(project, alice):
    """A trace with a failed tool call and a long id, held by alice in a queue."""
    failing = make_trace(LONG_ID)
    failing["messages"][3]["content"] = "Error: " + "upstream refused the connection " * 8
    ingest_traces(project=project, raw_items=[failing, *(make_trace(f"t-{i}") for i in range(3))])
    queue = build_queue(
        project=project, name="Tool failures", filters={}, filter_query="", sample_size=None,
        seed=None, reviewers_per_item=1, blind=False, assignees=[], created_by=alice,
    )  # fmt: skip
    item = reserve_next_item(queue=queue, reviewer=alice)
    return {
        "trace list": "/p/acme/traces/",
        "trace page": f"/p/acme/traces/{item.trace_id}/?queue={queue.pk}&item={item.pk}",
        "queue page": f"/p/acme/queues/{queue.pk}/",
        "monitors page": "/p/acme/monitors/",
    }


@pytest.fixture(params=[PHONE, WIDE], ids=["390px", "1440px"])
def width(request) -> int:
    return request.param


@pytest.fixture
def screen(browser: Browser, live_server, alice, width):
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": 844}
    )
    context.set_default_timeout(TIMEOUT_MS)
    sign_in(context, alice, live_server)
    yield context.new_page()
    context.close()


def test_no_page_is_wider_than_the_window(screen, pages, width):
    for name, path in pages.items():
        screen.goto(path)
        screen.wait_for_load_state("networkidle")
        scroll_width = screen.evaluate("document.documentElement.scrollWidth")
        assert scroll_width <= width, f"the {name} is {scroll_width} px wide in a {width} px window"


def test_the_navigation_is_a_menu_on_a_phone_and_a_bar_on_a_wide_screen(screen, pages, width):
    screen.goto(pages["trace list"])
    queues = screen.locator(".project-nav").get_by_role("link", name="Queues")
    if width == WIDE:
        expect(queues).to_be_visible()
        expect(screen.locator("label.nav-menu-button")).to_be_hidden()
        return
    expect(queues).to_be_hidden()
    screen.locator("label.nav-menu-button").click()
    expect(queues).to_be_visible()
    queues.click()
    screen.wait_for_url("**/p/acme/queues/")


def test_the_trace_page_puts_the_conversation_first_and_keeps_done_on_screen(screen, pages, width):
    screen.goto(pages["trace page"])
    done = screen.locator("#done-next")
    expect(done).to_be_visible()
    box = done.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width
    title = screen.locator(".trace-head h1").bounding_box()
    # The id wraps where it must, never a character per line.
    assert title["width"] >= min(300, width - 80)
    conversation = screen.locator("section.conversation").bounding_box()
    sidebar = screen.locator("aside.review").bounding_box()
    if width == PHONE:
        assert sidebar["y"] >= conversation["y"] + conversation["height"]
    else:
        assert sidebar["x"] >= conversation["x"] + conversation["width"]
