import pytest
from playwright.sync_api import Page, expect

from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Termination
from tests.e2e.conftest import at_both_widths
from tests.factories import make_trace

pytestmark = [pytest.mark.slow, at_both_widths]


@pytest.fixture
def traces(project):
    items = [make_trace(f"t-{i}") for i in range(4)]
    items[1]["messages"][1]["content"] = "Book a flight to Oslo"
    items[2]["termination"] = "timeout"
    items[3]["termination"] = "timeout"
    items[3]["messages"][1]["content"] = "Find a hotel in Oslo"
    ingest_traces(project=project, raw_items=items)


def listed_ids(page: Page):
    return page.locator("#trace-rows td.trace-id a")


def mark_document(page: Page) -> None:
    """A flag that a full page load would wipe out."""
    page.evaluate("window.__sameDocument = true")


def still_same_document(page: Page) -> bool:
    return page.evaluate("window.__sameDocument === true")


def test_typing_in_the_text_filter_narrows_the_list_in_place_and_in_the_url(bob_page, traces):
    page = bob_page
    page.goto("/p/acme/traces/")
    expect(listed_ids(page)).to_have_text(["t-3", "t-2", "t-1", "t-0"])
    mark_document(page)

    page.locator("#id_q").press_sequentially("oslo")

    expect(listed_ids(page)).to_have_text(["t-3", "t-1"])
    page.wait_for_url("**/p/acme/traces/?*q=oslo*")
    assert still_same_document(page)
    page.reload()
    expect(listed_ids(page)).to_have_text(["t-3", "t-1"])
    expect(page.locator("#id_q")).to_have_value("oslo")


def test_choosing_a_termination_narrows_the_list_in_place_and_in_the_url(bob_page, traces):
    page = bob_page
    page.goto("/p/acme/traces/")
    expect(listed_ids(page)).to_have_count(4)
    mark_document(page)

    page.get_by_label("Timeout").check()

    expect(listed_ids(page)).to_have_text(["t-3", "t-2"])
    page.wait_for_url("**/p/acme/traces/?*termination=timeout*")
    assert still_same_document(page)
    page.reload()
    expect(listed_ids(page)).to_have_text(["t-3", "t-2"])
    expect(page.get_by_label("Timeout")).to_be_checked()


def test_every_termination_is_a_visible_checkbox_and_two_combine(bob_page, traces):
    page = bob_page
    page.goto("/p/acme/traces/")
    boxes = page.locator("#trace-filters input[name=termination]")
    expect(boxes).to_have_count(len(Termination.choices))
    for label in Termination.labels:
        expect(page.get_by_label(label, exact=True)).to_be_visible()

    page.get_by_label("Timeout").check()
    page.get_by_label("Completed").check()  # no Ctrl-click: a second box adds to the first

    page.wait_for_url("**/p/acme/traces/?*termination=completed*termination=timeout*")
    expect(listed_ids(page)).to_have_count(4)
