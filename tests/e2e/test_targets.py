"""The targets page in Chromium: a reviewer makes one choice per feedback in place (htmx, no
reload), and a proposal's text is shown as text, never run."""

import pytest
from playwright.sync_api import expect

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.e2e.conftest import at_both_widths
from tests.factories import make_trace

pytestmark = [pytest.mark.slow, at_both_widths]

ATTACK = '<img src=x onerror="window.__xss=1"> Answer: 84.'


@pytest.fixture
def proposals(project) -> list[DistillationTarget]:
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    trace = project.traces.get()
    messages = trace.body_json()["messages"]
    feedback, _ = record_feedback(trace=trace, text="Begin with 'Answer:'.", turn=4)
    return [
        DistillationTarget.objects.create(
            feedback=feedback,
            turn=4,
            source="hint",
            student_context=messages[:4],
            original=messages[4],
            target={"role": "assistant", "content": reply},
            passes_checks=True,
        )
        for reply in ["Answer: 12 * 7 is 84.", ATTACK, "Answer: eighty-four."]
    ]


def test_using_one_proposal_decides_the_feedback_in_place(bob_page, proposals):
    page = bob_page
    page.goto("/p/acme/targets/")
    group = page.locator(f"#feedback-targets-{proposals[0].feedback_id}")
    expect(group.locator("pre.diff ins").first).to_have_text("Answer: ")
    page.evaluate("window.__stayed = true")  # gone if the page reloads

    group.get_by_role("button", name="Use this one").first.click()

    expect(group.locator("header .badge")).to_have_text("approved")
    assert page.evaluate("window.__stayed") is True
    assert page.evaluate("window.__xss") is None
    states = dict(DistillationTarget.objects.values_list("pk", "state"))
    assert states == {
        proposals[0].pk: TargetState.APPROVED,
        proposals[1].pk: TargetState.REJECTED,
        proposals[2].pk: TargetState.REJECTED,
    }


def test_an_edited_proposal_is_the_choice(bob_page, proposals):
    page = bob_page
    page.goto("/p/acme/targets/")
    group = page.locator(f"#feedback-targets-{proposals[0].feedback_id}")
    lead = group.locator(f"#target-{proposals[0].pk}")
    lead.locator("summary", has_text="Edit").click()
    lead.locator("textarea").fill("Answer: 84")

    lead.get_by_role("button", name="Save edit and use it").click()

    expect(group.locator("header .badge")).to_have_text("edited")
    edited = DistillationTarget.objects.get(pk=proposals[0].pk)
    assert (edited.state, edited.target["content"]) == (TargetState.EDITED, "Answer: 84")


def test_reject_all_leaves_nothing_to_choose(bob_page, proposals):
    page = bob_page
    page.goto("/p/acme/targets/")
    group = page.locator(f"#feedback-targets-{proposals[0].feedback_id}")
    group.locator(".other-proposals > summary").click()  # the attack is shown, as text
    # Little of the original is left in it: it is shown beside the original, not as a diff.
    expect(group.locator(".side-by-side pre", has_text="onerror").first).to_be_visible()
    expect(group.locator("img")).to_have_count(0)

    group.get_by_role("button", name="Reject all: none of these is right").click()

    expect(group.locator("header .badge")).to_have_text("all rejected")
    assert page.evaluate("window.__xss") is None
    assert set(DistillationTarget.objects.values_list("state", flat=True)) == {"rejected"}
