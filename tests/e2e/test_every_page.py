"""Every dashboard page as the demo's admin sees it, in Chromium: each answers 200 with no
console error, and each is captured as a full-page screenshot.

The screenshots go to APPRENTICE_SCREENSHOTS_DIR when it is set (bench/screenshots.py sets it
to the folder it is given), otherwise to a temporary folder, and are only checked.
"""

import os
from pathlib import Path

import pytest

from tests.e2e.conftest import demo_pages, sign_in

pytestmark = pytest.mark.slow


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
    pages = demo_pages(arguments)
    shown = sorted(pages)

    for name in shown:
        response = page.goto(pages[name])
        assert response is not None and response.status == 200, name
        page.wait_for_load_state("networkidle")  # htmx fragments that load with the page
        page.screenshot(path=folder / f"{name.replace('_', '-')}.png", full_page=True)
        assert errors == [], f"{name}: {errors}"

    written = sorted(path.name for path in folder.glob("*.png"))
    assert written >= sorted(f"{name.replace('_', '-')}.png" for name in shown)
    # Each is a rendered page, not a blank one.
    assert min((folder / f"{name.replace('_', '-')}.png").stat().st_size for name in shown) > 10_000
