"""/api/v1/docs in Chromium: Swagger UI runs under the app's CSP and lists the API's operations.

tests/site/test_api_docs.py checks the page's HTML and headers; this checks that the
browser actually runs it (the page was blank while the CSP blocked Swagger UI from a CDN).
"""

import pytest
from playwright.sync_api import Page, Route, expect

pytestmark = pytest.mark.slow

DOCS = "/api/v1/docs"
# Operations from the trace API and the review API's targets routes (path as Swagger shows it).
OPERATIONS = [
    ("get", "/api/v1/traces"),
    ("post", "/api/v1/traces"),
    ("get", "/api/v1/targets"),
    ("post", "/api/v1/targets/{target_id}/approve"),
]
# Registered before any page script runs: the CSP's own report of each thing it blocked.
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""


def open_docs(page: Page) -> list[str]:
    """Open the docs page; the console errors, page errors and CSP violations it caused."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.add_init_script(RECORD_CSP_VIOLATIONS)
    response = page.goto(DOCS)
    assert response is not None and response.status == 200
    return errors


def operation(page: Page, method: str, path: str):
    return page.locator(f".opblock-{method} .opblock-summary-path[data-path='{path}']")


def csp_violations(page: Page) -> list[str]:
    return page.evaluate("window.__cspViolations")


def test_swagger_ui_renders_the_operations_without_errors_or_csp_violations(page, db):
    errors = open_docs(page)

    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Apprentice API")
    for method, path in OPERATIONS:
        expect(operation(page, method, path)).to_be_visible()
    assert page.locator(".opblock").count() >= 20  # the whole document, not a few routes
    page.wait_for_load_state("networkidle")  # assets and the OpenAPI document all answered
    assert errors == []
    assert csp_violations(page) == []


def test_the_check_fails_when_the_csp_blocks_swagger_ui(page, db):
    """The same page with a CSP that refuses this server's scripts, as the CDN's were refused:
    no operation shows, and the console and the CSP both say why."""

    def refuse_scripts(route: Route) -> None:
        response = route.fetch()
        headers = {**response.headers, "content-security-policy": "script-src 'none'"}
        route.fulfill(response=response, headers=headers)

    page.route(f"**{DOCS}", refuse_scripts)
    errors = open_docs(page)
    page.wait_for_load_state("networkidle")

    expect(operation(page, *OPERATIONS[0])).to_have_count(0)
    assert page.locator(".opblock").count() == 0
    assert any("Content Security Policy" in error for error in errors), errors
    assert any(violation.startswith("script-src") for violation in csp_violations(page))
