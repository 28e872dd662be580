"""The trace list's selection and saved views in a browser: "select all" ticks every row, a
bulk tag reaches exactly the ticked traces, and a saved view opens the list as it was filtered."""

import re

import pytest
from playwright.sync_api import expect

from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.e2e.conftest import at_both_widths, sign_in
from tests.factories import make_trace

pytestmark = [pytest.mark.slow, at_both_widths]


@pytest.fixture
def alice_list(context, page, live_server, project, alice):
    traces = [
        make_trace(f"t-{i}", termination="timeout" if i == 1 else "completed") for i in range(3)
    ]
    ingest_traces(project=project, raw_items=traces)
    Tag.objects.create(project=project, name="slow")
    sign_in(context, alice, live_server)
    page.goto("/p/acme/traces/")
    return page


def test_select_all_ticks_every_row_and_one_cleared_row_shows_mixed(alice_list):
    page = alice_list
    select_all = page.get_by_label("Select all traces on this page")
    select_all.check()
    rows = page.locator("input[name=trace]")
    expect(rows).to_have_count(3)
    for index in range(3):
        expect(rows.nth(index)).to_be_checked()

    page.get_by_label("Select t-1").uncheck()

    assert select_all.evaluate("box => box.indeterminate") is True
    expect(select_all).not_to_be_checked()


def test_a_bulk_tag_reaches_exactly_the_ticked_traces(alice_list, project):
    page = alice_list
    page.get_by_label("Select t-0").check()
    page.get_by_label("Select t-2").check()
    page.get_by_label("Add the tag").select_option(label="slow")
    page.get_by_role("button", name="Tag them").click()

    expect(page.get_by_text("Tagged 2 traces “slow”.")).to_be_visible()
    tagged = TraceTag.objects.filter(tag__name="slow").values_list("trace__external_id", flat=True)
    assert sorted(tagged) == ["t-0", "t-2"]


def test_a_saved_view_opens_the_list_with_its_filters(alice_list):
    page = alice_list
    page.goto("/p/acme/traces/?termination=timeout")
    page.get_by_label("Name this view").fill("just one")
    page.get_by_role("button", name="Save view").click()
    page.goto("/p/acme/traces/")

    page.get_by_role("link", name="just one").click()

    expect(page).to_have_url(re.compile(r"/p/acme/traces/\?termination=timeout$"))
    expect(page.locator("input[name=trace]")).to_have_count(1)
    expect(page.get_by_label("Select t-1")).to_be_visible()
