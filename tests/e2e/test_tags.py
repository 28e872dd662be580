"""The taxonomy page in Chromium: an admin renames a tag and merges one into another in place."""

import pytest
from playwright.sync_api import expect

from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.e2e.conftest import sign_in
from tests.factories import make_trace

pytestmark = pytest.mark.slow


@pytest.fixture
def alice_page(context, page, live_server, alice):
    sign_in(context, alice, live_server)
    return page


@pytest.fixture
def tags(project, bob):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    slow, late = (Tag.objects.create(project=project, name=name) for name in ("slow", "late"))
    TraceTag.objects.create(trace=project.traces.get(), tag=slow, reviewer=bob)
    return slow, late


def mark_document(page) -> None:
    page.evaluate("window.__sameDocument = true")


def test_an_admin_renames_then_merges_a_tag_without_leaving_the_page(alice_page, tags):
    page = alice_page
    slow, _ = tags
    page.goto("/p/acme/tags/")
    mark_document(page)

    row = page.locator(f"#tag-{slow.pk}")
    row.locator("summary").click()
    row.get_by_label("Rename to").fill("too-slow")
    row.get_by_role("button", name="Rename").click()
    expect(page.locator("#taxonomy .tag")).to_have_text(["late", "too-slow"])

    row = page.locator(f"#tag-{slow.pk}")
    row.locator("summary").click()
    row.get_by_label("Merge into").select_option(label="late")
    row.get_by_role("button", name="Merge").click()

    expect(page.locator("#taxonomy .tag")).to_have_text(["late"])
    assert page.evaluate("window.__sameDocument === true")
    assert list(TraceTag.objects.values_list("tag__name", flat=True)) == ["late"]
