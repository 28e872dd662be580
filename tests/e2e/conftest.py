"""Browser tests: the dashboard in headless Chromium (Debian's package) driven by Playwright."""

import io
import shutil
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.proposals import propose_targets_for
from reviewapp.learning.runs import start_retrain
from reviewapp.monitors.models import TriageRule
from reviewapp.projects.models import Project
from reviewapp.review.feedback import mark_feedback_failed
from reviewapp.review.models import Feedback, FeedbackStatus, Queue
from reviewapp.traces.models import Tag
from tests.site.test_views_every_page import PAGES, _named_patterns

# Playwright's own browser downloads are not reachable here; the distribution's chromium is.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}
WIDE = {"width": 1440, "height": 900}
# A module's tests at a phone's width and a wide screen's: `pytestmark = [..., at_both_widths]`.
at_both_widths = pytest.mark.parametrize(
    "viewport", [PHONE, WIDE], ids=["390px", "1440px"], indirect=True
)
TIMEOUT_MS = 10_000  # a step the dashboard can't finish in 10 s is a failure, not slowness


@pytest.fixture
def browser(monkeypatch) -> Iterator[Browser]:
    """A browser for one test.

    While Playwright's sync API is started it keeps an asyncio loop running in this thread, and
    Django refuses ORM calls from such a thread unless told they are synchronous, which the
    test's are. One browser per test keeps that to the browser tests.
    """
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("browser tests need Debian's chromium; bin/test installs it via apt-get")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
        # Started, Playwright runs this thread in a contextvars context of its own, where Django
        # opened connections of its own: close them while that context is still current.
        connections.close_all()


@pytest.fixture
def viewport(request) -> dict:
    """The window's size: VIEWPORT, or each of `at_both_widths`."""
    return getattr(request, "param", VIEWPORT)


@pytest.fixture
def context(browser, live_server, viewport) -> Iterator[BrowserContext]:
    context = browser.new_context(base_url=live_server.url, viewport=viewport)
    context.set_default_timeout(TIMEOUT_MS)
    yield context
    context.close()


def accept_dialog(dialog) -> None:
    """Say yes, as a person who means it does: forms with data-confirm ask before they post."""
    dialog.accept()


@pytest.fixture
def page(context) -> Page:
    """A new page that accepts every confirmation (a test of one removes this handler)."""
    page = context.new_page()
    page.on("dialog", accept_dialog)
    return page


def sign_in(context: BrowserContext, user, live_server) -> None:
    """Give the browser a session cookie for `user`, skipping the login form."""
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    context.add_cookies(
        [{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server.url}]
    )


@pytest.fixture
def bob_page(context, page, live_server, bob) -> Page:
    """A page signed in as bob, a reviewer of the acme project."""
    sign_in(context, bob, live_server)
    return page


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
    """The seeded demo after a first hour of review, and its admin."""
    settings.VAR_DIR = tmp_path / "var"
    call_command("seed_demo", "--traces", "20", stdout=io.StringIO())
    admin = get_user_model().objects.get(username="admin")
    return _review_the_demo(Project.objects.get(slug="demo"), admin), admin


def demo_pages(arguments: dict) -> dict[str, str]:
    """Every dashboard page the demo can show (tests/site lists them), by URL name: its path."""
    needs = {pattern.name: pattern.pattern.converters for pattern in _named_patterns()}
    return {
        name: reverse(name, kwargs={key: arguments[key] for key in needs[name]})
        for name in sorted(set(PAGES) - NOT_IN_THE_DEMO)
    }
