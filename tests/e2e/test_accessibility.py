"""The sign-in page and every dashboard page (as the demo's admin sees it), on a phone (390 px,
menu open) and on a wide screen (1440 px), pass axe-core with no violation of impact "serious"
or "critical".

axe-core (axe.min.js, bundled by the axe-playwright-python wheel: nothing is fetched) runs all
its rules but the experimental ones, in the page through the DevTools protocol, which the
page's CSP does not govern. Minor and moderate findings are not failures here.
"""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.urls import reverse
from playwright.sync_api import Browser

from tests.e2e.conftest import TIMEOUT_MS, demo_pages, sign_in

pytestmark = pytest.mark.slow

PHONE, WIDE = 390, 1440
FAILING = {"serious", "critical"}


def _findings(results: dict, page_name: str, width: int) -> list[str]:
    """One line per serious or critical violation: rule, impact, page, width and the elements."""
    return [
        f"{violation['id']} ({violation['impact']}) on {page_name} at {width} px: "
        + "; ".join(" ".join(node["target"]) for node in violation["nodes"][:5])
        + (f" and {len(violation['nodes']) - 5} more" if len(violation["nodes"]) > 5 else "")
        for violation in results["violations"]
        if violation["impact"] in FAILING
    ]


def test_no_page_has_a_serious_or_critical_accessibility_violation(
    demo, browser: Browser, live_server
):
    arguments, admin = demo
    pages = demo_pages(arguments)
    axe = Axe()
    findings: list[str] = []
    for width in (PHONE, WIDE):
        context = browser.new_context(
            base_url=live_server.url, viewport={"width": width, "height": 844}
        )
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        # Signed out first: everyone starts at the sign-in page (not a dashboard page).
        page.goto(reverse("login"))
        findings += _findings(axe.run(page).response, "login", width)
        sign_in(context, admin, live_server)
        for name, path in pages.items():
            response = page.goto(path)
            assert response is not None and response.status == 200, name
            page.wait_for_load_state("networkidle")  # htmx fragments that load with the page
            if width == PHONE:
                page.locator("label.nav-menu-button").click()  # the navigation is checked too
            findings += _findings(axe.run(page).response, name, width)
        context.close()
    assert findings == [], "\n".join(findings)
