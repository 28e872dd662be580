import re

import pytest
from playwright.sync_api import expect

from reviewapp.review.models import Feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace

pytestmark = pytest.mark.slow


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-calc")])
    return project.traces.get()


@pytest.fixture
def tags(project):
    return [Tag.objects.create(project=project, name=name) for name in ("hallucination", "slow")]


def test_opening_a_trace_from_the_list_shows_each_tool_call_beside_its_result(bob_page, trace):
    page = bob_page
    page.goto("/p/acme/traces/")

    page.get_by_role("link", name="t-calc").click()

    page.wait_for_url(f"**/p/acme/traces/{trace.pk}/")
    expect(page.locator(".conversation .role-user pre")).to_have_text("What is 12 * 7?")
    call = page.locator(".tool-call .call")
    result = page.locator(".tool-call .result")
    expect(call).to_contain_text("calculator")
    expect(call).to_contain_text('"expression": "12*7"')
    expect(result.locator("pre")).to_have_text("84")
    call_box, result_box = call.bounding_box(), result.bounding_box()
    assert result_box["x"] >= call_box["x"] + call_box["width"]
    assert result_box["y"] == call_box["y"]
    # The tool message is shown with its call, not again as a turn of its own.
    expect(page.locator(".turn.role-tool")).to_have_count(0)


def test_pressing_a_number_toggles_that_tag_on_and_off(bob_page, bob, trace, tags):
    page = bob_page
    page.goto(f"/p/acme/traces/{trace.pk}/")
    first_tag = page.locator('.tag-toggle[data-key="1"]')
    expect(first_tag).to_have_attribute("aria-pressed", "false")

    page.keyboard.press("1")

    expect(first_tag).to_have_attribute("aria-pressed", "true")
    assert list(TraceTag.objects.filter(trace=trace).values_list("tag__name", "reviewer")) == [
        ("hallucination", bob.pk)
    ]
    page.keyboard.press("1")
    expect(first_tag).to_have_attribute("aria-pressed", "false")
    assert not TraceTag.objects.filter(trace=trace).exists()


def test_j_and_k_move_the_focus_between_turns(bob_page, trace):
    page = bob_page
    page.goto(f"/p/acme/traces/{trace.pk}/")
    focused = page.locator(".turn.focused")

    page.keyboard.press("j")
    expect(focused).to_have_attribute("data-turn", "0")
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(focused).to_have_attribute("data-turn", "2")
    expect(focused).to_be_focused()
    page.keyboard.press("k")
    expect(focused).to_have_attribute("data-turn", "1")
    expect(focused).to_have_count(1)


def test_feedback_pinned_to_a_tool_call_is_saved_against_that_call(bob_page, trace):
    page = bob_page
    page.goto(f"/p/acme/traces/{trace.pk}/")

    page.locator(".tool-call").get_by_role("button", name="feedback").click()
    expect(page.locator("#feedback-form textarea[name=text]")).to_be_focused()
    expect(page.locator("#id_anchor")).to_have_value("call:call_1")
    page.keyboard.type("Use the exact expression from the question.")
    page.get_by_role("button", name="Save feedback").click()

    saved = page.locator("#feedback-panel article.feedback")
    expect(saved).to_have_count(1)
    expect(saved.locator("header")).to_have_text(re.compile(r"^bob on tool call call_1"))
    expect(saved.locator("p")).to_have_text("Use the exact expression from the question.")
    feedback = Feedback.objects.get(trace=trace)
    assert (feedback.tool_call_id, feedback.turn) == ("call_1", 2)
    assert feedback.text == "Use the exact expression from the question."
