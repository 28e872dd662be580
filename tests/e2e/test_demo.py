"""The demo as bin/run seeds it, in Chromium: keyboard tagging works on its first trace, and the
keyboard map lists every key the page answers to."""

import io
import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from playwright.sync_api import expect

from reviewapp.traces.models import TraceTag
from tests.e2e.conftest import sign_in

pytestmark = pytest.mark.slow

REVIEW_JS = Path(__file__).resolve().parents[2] / "static" / "js" / "review.js"


@pytest.fixture
def admin_page(context, page, live_server, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", "--traces", "20", stdout=io.StringIO())
    sign_in(context, get_user_model().objects.get(username="admin"), live_server)
    return page


def test_pressing_1_tags_the_demos_first_trace(admin_page):
    page = admin_page
    page.goto("/p/demo/traces/")
    first = page.locator("#trace-rows td.trace-id a").first
    external_id = first.inner_text()
    first.click()
    page.wait_for_url(re.compile(r"/traces/\d+/$"))  # the trace page and its deferred script
    first_tag = page.locator('.tag-toggle[data-key="1"]')
    expect(first_tag).to_have_attribute("aria-pressed", "false")

    page.keyboard.press("1")

    expect(first_tag).to_have_attribute("aria-pressed", "true")
    tagged = TraceTag.objects.filter(trace__external_id=external_id, reviewer__username="admin")
    assert [trace_tag.tag.name for trace_tag in tagged] == [first_tag.inner_text()[2:]]


def test_the_keyboard_map_lists_every_key_review_js_answers_to(admin_page):
    page = admin_page
    page.goto("/p/demo/traces/")
    page.locator("#trace-rows td.trace-id a").first.click()
    # "?" pressed before the trace page's deferred script runs would go nowhere.
    page.wait_for_url(re.compile(r"/traces/\d+/$"))
    keys = set(re.findall(r'key === "(.)"', REVIEW_JS.read_text()))
    assert keys >= {"j", "k", "f", "n", "?"}  # the pattern still reads the script

    page.keyboard.press("?")

    keymap = page.locator("#keymap")
    expect(keymap).to_be_visible()
    listed = " ".join(keymap.locator("dt").all_inner_texts())
    assert all(re.search(rf"(^|\s){re.escape(key)}(\s|$)", listed) for key in keys), listed
    assert "1-9" in listed
    # Each numbered tag of the page is named in the map.
    for button in page.locator(".tag-toggle[data-key]").all()[:9]:
        expect(keymap).to_contain_text(button.inner_text())
