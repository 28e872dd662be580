"""Judging targets from the keyboard in Chromium: j/k move between proposals, a approves, e
edits, r rejects all, each choice moves on to the next feedback, and ? lists the keys."""

import pytest
from playwright.sync_api import expect

from reviewapp.learning.models import DistillationTarget, TargetState
from tests.e2e.conftest import at_both_widths
from tests.factories import feedback_with_proposals

pytestmark = [pytest.mark.slow, at_both_widths]


@pytest.fixture
def three_feedback(project) -> list[list[DistillationTarget]]:
    """Three feedback items with two proposals each, in the order the page lists them."""
    groups = [
        feedback_with_proposals(project, external_id, ["Answer: 12 * 7 is 84.", "Answer: 84."])[1]
        for external_id in ("t-1", "t-2", "t-3")
    ]
    return groups[::-1]  # newest feedback first


def test_keys_approve_edit_and_reject_moving_on_after_each(bob_page, three_feedback):
    page = bob_page
    page.goto("/p/acme/targets/")
    first, second, third = three_feedback

    page.keyboard.press("j")
    expect(page.locator(f"#target-{first[0].pk}")).to_be_focused()
    page.keyboard.press("j")  # the next proposal sits in the folded "other proposals"
    expect(page.locator(f"#target-{first[1].pk}")).to_be_focused()
    page.keyboard.press("k")
    expect(page.locator(f"#target-{first[0].pk}")).to_be_focused()

    page.keyboard.press("a")
    group = page.locator(f"#feedback-targets-{first[0].feedback_id}")
    expect(group.locator("header .badge")).to_have_text("approved")
    expect(group.locator(".siblings-rejected")).to_have_text(
        "Approving this rejected 1 other proposal for the same feedback: one choice per feedback."
    )
    expect(page.locator(f"#target-{second[0].pk}")).to_be_focused()

    page.keyboard.press("e")
    textarea = page.locator(f"#target-{second[0].pk} textarea")
    expect(textarea).to_be_focused()
    textarea.fill("")
    page.keyboard.type("Answer: 84, as a number.")  # its "a" and "e" are text, not keys
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator(f"#feedback-targets-{second[0].feedback_id} header .badge")).to_have_text(
        "edited"
    )
    expect(page.locator(f"#target-{third[0].pk}")).to_be_focused()

    page.keyboard.press("r")
    expect(page.locator(f"#feedback-targets-{third[0].feedback_id} header .badge")).to_have_text(
        "all rejected"
    )

    states = dict(DistillationTarget.objects.values_list("pk", "state"))
    assert [states[t.pk] for group in three_feedback for t in group] == [
        TargetState.APPROVED,
        TargetState.REJECTED,
        TargetState.EDITED,
        TargetState.REJECTED,
        TargetState.REJECTED,
        TargetState.REJECTED,
    ]
    assert DistillationTarget.objects.get(pk=second[0].pk).target["content"] == (
        "Answer: 84, as a number."
    )


def test_the_shortcut_sheet_lists_the_target_keys(bob_page, three_feedback):
    page = bob_page
    page.goto("/p/acme/targets/")

    page.keyboard.press("?")

    keymap = page.locator("#keymap")
    expect(keymap).to_be_visible()
    expect(keymap).to_contain_text("approve the proposal (use this one)")
    expect(keymap).to_contain_text("reject all of its feedback's proposals")
