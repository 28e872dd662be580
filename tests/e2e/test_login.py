import re

import pytest

from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace

pytestmark = pytest.mark.slow


def test_logging_in_through_the_form_lands_on_the_trace_list(page, project, bob):
    ingest_traces(project=project, raw_items=[make_trace("t-login")])

    page.goto("/")
    page.wait_for_url(re.compile(r"/login/\?next=/$"))
    page.get_by_label("Username").fill("bob")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()

    page.wait_for_url(re.compile(r"/p/acme/traces/$"))
    assert page.locator("table.traces").get_by_role("link", name="t-login").is_visible()
    assert page.locator(".who").inner_text().startswith("bob")
