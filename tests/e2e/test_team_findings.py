"""Two of a review team's findings in Chromium, at a phone's width and a wide screen's: "which
traces hit a tool failure?" answers with every one of them and their count, however the episode
ended; the settings area is reachable from the navigation and a reviewer is turned away from it
on a styled page that says why."""

import pytest
from playwright.sync_api import expect

from reviewapp.traces.ingest import ingest_traces
from tests.e2e.conftest import PHONE, at_both_widths, sign_in
from tests.factories import make_trace

pytestmark = [pytest.mark.slow, at_both_widths]


def _failed_lookup(external_id: str, termination: str) -> dict:
    trace = make_trace(external_id, termination=termination)
    trace["messages"][3]["content"] = "Error: the calculator service timed out"
    return trace


@pytest.fixture
def traces(project):
    ingest_traces(
        project=project,
        raw_items=[
            _failed_lookup("failed-then-completed", "completed"),
            _failed_lookup("ended-in-tool-error", "tool_error"),
            make_trace("clean"),
        ],
    )


def _open_nav(page, viewport) -> None:
    """On a phone the project's navigation is behind the Menu button."""
    if viewport == PHONE:
        page.locator("label.nav-menu-button").click()


def test_a_tool_call_failed_finds_every_such_trace_and_counts_them(bob_page, traces):
    page = bob_page
    page.goto("/p/acme/traces/")
    expect(page.locator("#match-count")).to_contain_text("3 traces match")

    page.locator("#id_tool_failure").select_option(label="a tool call failed")

    expect(page.locator("#trace-rows td.trace-id a")).to_have_text(
        ["ended-in-tool-error", "failed-then-completed"]
    )
    expect(page.locator("#match-count")).to_contain_text("2 traces match")


def test_an_admin_reaches_the_settings_from_the_navigation(
    context, page, live_server, alice, viewport
):
    sign_in(context, alice, live_server)
    page.goto("/p/acme/traces/")
    _open_nav(page, viewport)

    page.locator(".project-nav").get_by_role("link", name="Settings").click()

    page.wait_for_url("**/p/acme/settings/")
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    scroll_width = page.evaluate("document.documentElement.scrollWidth")
    assert scroll_width <= viewport["width"]


def test_a_reviewer_opening_members_gets_a_styled_page_saying_who_may(bob_page):
    response = bob_page.goto("/p/acme/members/")

    assert response.status == 403
    expect(bob_page.get_by_role("heading", name="You cannot open this page")).to_be_visible()
    expect(bob_page.get_by_text("Only project admins can do this")).to_be_visible()
    expect(bob_page.locator("link[rel=stylesheet]")).not_to_have_count(0)
