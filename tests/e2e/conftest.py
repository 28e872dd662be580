"""Browser tests: the dashboard in headless Chromium (Debian's package) driven by Playwright."""

import shutil
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connections
from django.test import Client
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

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
