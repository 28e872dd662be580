"""Way-finding and safety in Chromium: saving feedback under the CSP, the skip link, and the
confirmation a destructive form asks for."""

import re

import pytest
from playwright.sync_api import expect

from reviewapp.projects.models import ApiKey
from reviewapp.projects.services import create_api_key
from reviewapp.traces.ingest import ingest_traces
from tests.e2e.conftest import accept_dialog, at_both_widths, sign_in
from tests.factories import make_trace

pytestmark = [pytest.mark.slow, at_both_widths]


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-calc")])
    return project.traces.get()


def watch_csp(page) -> list[str]:
    errors: list[str] = []
    page.on(
        "console",
        lambda message: "Content Security Policy" in message.text and errors.append(message.text),
    )
    return errors


def test_saving_feedback_marks_it_and_its_turn_and_the_csp_blocks_nothing(bob_page, trace):
    page = bob_page
    csp_errors = watch_csp(page)
    page.goto(f"/p/acme/traces/{trace.pk}/")

    page.locator('button.pin[data-anchor="turn:4"]').click()
    page.locator("#feedback-form textarea[name=text]").fill("Begin with 'Answer:'.")
    # As a reader who dragged the box bigger: the browser gives it a style attribute, which a
    # swap must not copy onto the new box (setting one is an inline style the CSP blocks).
    page.locator("#feedback-form textarea[name=text]").evaluate("box => box.style.height = '9em'")
    page.get_by_role("button", name="Save feedback").click()

    saved = page.locator(".feedback.just-saved")
    expect(saved).to_contain_text("Begin with 'Answer:'.")
    expect(saved).to_be_in_viewport()
    expect(page.locator("#turn-4")).to_have_class(re.compile(r"\bhas-new-feedback\b"))
    assert csp_errors == []


def test_the_skip_link_is_the_first_tab_stop_and_jumps_to_the_content(bob_page, trace):
    page = bob_page
    page.goto("/p/acme/traces/")

    page.keyboard.press("Tab")

    skip = page.locator(":focus")
    expect(skip).to_have_text("Skip to content")
    expect(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    expect(page.locator(":focus")).to_have_id("main")


def test_revoking_a_key_asks_first_and_only_a_yes_revokes(
    context, page, live_server, alice, project
):
    key, _ = create_api_key(project=project, name="harness")
    sign_in(context, alice, live_server)
    page.remove_listener("dialog", accept_dialog)
    questions: list[str] = []

    def answer_no(dialog) -> None:
        questions.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", answer_no)
    page.goto("/p/acme/keys/")

    page.get_by_role("button", name="Revoke").click()

    expect(page.get_by_role("button", name="Revoke")).to_be_visible()
    assert questions and questions[0].startswith("Revoke the key harness?")
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None
    page.remove_listener("dialog", answer_no)
    page.on("dialog", accept_dialog)
    page.get_by_role("button", name="Revoke").click()
    expect(page.locator("table.traces tbody")).to_contain_text("revoked")
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
