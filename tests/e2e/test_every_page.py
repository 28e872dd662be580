"""Every dashboard page as the demo's admin sees it, in Chromium: each answers 200 with no
console error, and each is captured as a full-page screenshot.

The screenshots go to APPRENTICE_SCREENSHOTS_DIR when it is set (bench/screenshots.py sets it
to the folder it is given), otherwise to a temporary folder, and are only checked.
"""

import io
import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.urls import reverse

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.proposals import propose_targets_for
from reviewapp.learning.runs import start_retrain
from reviewapp.monitors.models import TriageRule
from reviewapp.projects.models import Project
from reviewapp.review.feedback import mark_feedback_failed
from reviewapp.review.models import Feedback, FeedbackStatus, Queue, Tag
from tests.e2e.conftest import sign_in
from tests.site.test_views_every_page import PAGES, _named_patterns

pytestmark = pytest.mark.slow

# The demo trains no adapter (its page needs one): the adapters list shows what to do instead.
NOT_IN_THE_DEMO = {"adapter_detail"}


def _review_the_demo(project: Project, admin) -> dict:
    """What a first hour of review leaves on the seeded demo, so each page has something: the
    corrected feedback's target (built as the worker builds it: a correction needs no teacher),
    teacher proposals for another (FAKE: written here, as the target task stores them; the
    bundled teacher takes minutes), a feedback nothing usable came out of, a triage rule and a
    queued run."""
    feedback = {
        item.trace.external_id: item
        for item in Feedback.objects.filter(trace__project=project, correction__isnull=False)
    }
    corrected = next(iter(feedback.values()))
    feedback = {
        item.trace.external_id: item
        for item in Feedback.objects.filter(trace__project=project).select_related("trace")
        if not item.correction
    }
    propose_targets_for(feedback_id=corrected.pk)
    sentence = feedback["demo-0002"]
    messages = sentence.trace.body_json()["messages"]
    original = messages[-1]["content"]
    # Passing and closest to the original first, as the target task ranks them.
    shorter = original.replace(" of purchase", "").replace(" business", "")
    for reply, passes in [
        (f"You asked about our policy. {original} Anything else I can help with today?", False),
        (f"{original} Let me know if there is anything else.", True),
        (shorter, True),
    ]:
        DistillationTarget.objects.create(
            feedback=sentence,
            turn=len(messages) - 1,
            source="hint",
            student_context=messages[:-1],
            original=messages[-1],
            target={"role": "assistant", "content": reply},
            passes_checks=passes,
            state=TargetState.PROPOSED,
        )
    sentence.status = FeedbackStatus.USED
    sentence.save(update_fields=["status"])
    mark_feedback_failed(
        feedback_id=feedback["demo-0003"].pk,
        reason="none of the teacher's 16 revisions followed it (checks failed); "
        "write a corrected turn instead",
    )
    queue = Queue.objects.get(project=project)
    rule = TriageRule.objects.create(
        project=project, name="Tool errors", queue=queue, termination="tool_error"
    )
    run = start_retrain(project=project, created_by=admin)
    return {
        "slug": project.slug,
        # The trace whose feedback asks for a corrected turn.
        "trace_id": feedback["demo-0003"].trace_id,
        "tag_id": Tag.objects.filter(project=project).order_by("id").first().pk,
        "queue_id": queue.pk,
        "rule_id": rule.pk,
        "run_id": run.pk,
    }


@pytest.fixture
def demo(settings, tmp_path) -> tuple[dict, object]:
    settings.VAR_DIR = tmp_path / "var"
    call_command("seed_demo", "--traces", "20", stdout=io.StringIO())
    admin = get_user_model().objects.get(username="admin")
    return _review_the_demo(Project.objects.get(slug="demo"), admin), admin


def test_every_page_answers_the_admin_without_console_errors_and_is_captured(
    demo, context, page, live_server, tmp_path
):
    arguments, admin = demo
    sign_in(context, admin, live_server)
    folder = Path(os.environ.get("APPRENTICE_SCREENSHOTS_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    patterns = {pattern.name: pattern for pattern in _named_patterns()}
    shown = sorted(set(PAGES) - NOT_IN_THE_DEMO)

    for name in shown:
        kwargs = {key: arguments[key] for key in patterns[name].pattern.converters}
        response = page.goto(reverse(name, kwargs=kwargs))
        assert response is not None and response.status == 200, name
        page.wait_for_load_state("networkidle")  # htmx fragments that load with the page
        page.screenshot(path=folder / f"{name.replace('_', '-')}.png", full_page=True)
        assert errors == [], f"{name}: {errors}"

    written = sorted(path.name for path in folder.glob("*.png"))
    assert written >= sorted(f"{name.replace('_', '-')}.png" for name in shown)
    # Each is a rendered page, not a blank one.
    assert min((folder / f"{name.replace('_', '-')}.png").stat().st_size for name in shown) > 10_000
