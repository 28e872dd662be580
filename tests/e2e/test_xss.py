"""Trace text is data: a corpus of injection payloads, put in every field a trace, a review or a
queue shows, must come out as visible text and never as markup, a script, an htmx attribute or
a URL. The fast test reads the server's HTML; the browser test runs the pages in Chromium.
"""

import json
from html.parser import HTMLParser
from urllib.parse import urlencode, urlsplit

import pytest
from django.test import Client
from playwright.sync_api import Page, expect

from reviewapp.projects.models import Membership
from reviewapp.review.feedback import record_feedback
from reviewapp.review.queues import build_queue, reserve_next_item
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace

PAYLOADS = [
    "<script>window.__xss=1</script>",
    '<img src=x onerror="window.__xss=1">',
    "<img src=x onerror=alert(1)>",
    "<svg onload=window.__xss=1>",
    "[click](javascript:window.__xss=1)",
    "[click](JaVaScRiPt:window.__xss=1)",
    "![x](javascript:window.__xss=1)",
    "[data](data:text/html;base64,PHNjcmlwdD53aW5kb3cuX194c3M9MTwvc2NyaXB0Pg==)",
    '<a href="javascript:window.__xss=1">click</a>',
    '<a href="jav&#x09;ascript:window.__xss=1">tab</a>',
    '<div hx-get="/logout/" hx-trigger="load">x</div>',
    '<div hx-on:click="window.__xss=1">click me</div>',
    '<form hx-post="/logout/" hx-trigger="load"><button>go</button></form>',
    '"><script>window.__xss=1</script>',
    "'><img src=x onerror=window.__xss=1>",
    '<iframe srcdoc="<script>parent.__xss=1</script>"></iframe>',
    "<details open ontoggle=window.__xss=1>",
    "{{7*7}} {% debug %} ${7*7} <%= 7*7 %>",
    "<style>body{display:none}</style>",
    "<math><mtext><table><mglyph><style><img src=x onerror=window.__xss=1>",
    '<base href="javascript:/a/">',
    "</pre><script>window.__xss=1</script><pre>",
    "</textarea><script>window.__xss=1</script>",
    "<input autofocus onfocus=window.__xss=1>",
    '<meta http-equiv="refresh" content="0;url=javascript:window.__xss=1">',
    "<object data=javascript:window.__xss=1></object>",
    '<https://example.com/" onmouseover="window.__xss=1>',
]

# Elements no page of the dashboard has in its body; one there came from trace text.
FORBIDDEN_TAGS = {
    "script", "iframe", "frame", "object", "embed", "svg", "math", "img", "style", "base",
    "meta", "link", "mglyph",
}  # fmt: skip
SAFE_URL_SCHEMES = {"", "http", "https", "mailto"}


def _no_slash(payload: str) -> str:
    return payload.replace("/", "")


def payload_trace(index: int, payload: str) -> dict:
    """A trace carrying `payload` in every text field the dashboard shows."""
    name = payload[:200]
    return {
        # An external_id may not hold '/'; what is left is still markup.
        "external_id": f"{index:02d} {_no_slash(payload)}",
        "model": name,
        "messages": [
            {"role": "system", "content": payload},
            {"role": "user", "content": payload, "name": name},
            {
                "role": "assistant",
                "content": payload,
                "tool_calls": [
                    {
                        "id": name,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps({payload: payload})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": name, "content": payload},
            {"role": "assistant", "content": payload},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": payload,
                    "parameters": {
                        "type": "object",
                        "properties": {payload: {"type": "string", "description": payload}},
                    },
                },
            }
        ],
        "metadata": {payload: payload, "nested": {"list": [payload]}},
        "termination": "tool_error",
        "outcome": {"reward": 0.0, "success": False},
        "tags": [payload[:100]],
    }


@pytest.fixture
def payload_pages(project, bob) -> dict[str, str | None]:
    """Every dashboard page that shows the payloads, each payload stored everywhere it can be.

    Maps each page to the payload it shows as plain text, for a trace's own page.
    """
    # The queue form is an admin's page: bob reads every page here as an admin.
    Membership.objects.filter(project=project, user=bob).update(role="admin")
    results = ingest_traces(
        project=project,
        raw_items=[payload_trace(index, payload) for index, payload in enumerate(PAYLOADS)],
    )
    assert [result.status for result in results] == [201] * len(PAYLOADS)
    traces = list(Trace.objects.filter(project=project).order_by("id"))
    pages: dict[str, str | None] = dict.fromkeys(
        ["/p/acme/traces/", "/p/acme/tags/", "/p/acme/queues/", "/p/acme/queues/new/"]
    )
    pages["/p/acme/traces/?" + urlencode([("tag", payload[:100]) for payload in PAYLOADS[:3]])] = (
        None
    )
    for trace, payload in zip(traces, PAYLOADS, strict=True):
        Trace.objects.filter(pk=trace.pk).update(adapter_version=payload[:200])
        name = payload[:200]
        record_feedback(trace=trace, text=payload, author=payload, tool_call_id=name, reviewer=bob)
        record_feedback(
            trace=trace,
            text=payload,
            author=payload,
            turn=4,
            rating=-1.0,
            correction={
                "content": payload,
                "tool_calls": [
                    {
                        "id": name,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps({payload: payload})},
                    }
                ],
            },
            checks=[{"kind": "calls_tool", "value": name}],
        )
        queue = build_queue(
            project=project,
            name=name,
            filters={"tag": [], "termination": []},
            filter_query=payload[:2000],
            sample_size=None,
            seed=None,
            reviewers_per_item=1,
            blind=False,
            assignees=[],
            created_by=bob,
        )
        item = reserve_next_item(queue=queue, reviewer=bob)
        pages[f"/p/acme/traces/{trace.pk}/"] = payload
        pages[f"/p/acme/traces/{item.trace_id}/?queue={queue.pk}&item={item.pk}"] = None
        pages[f"/p/acme/queues/{queue.pk}/"] = None
        pages[f"/p/acme/queues/{queue.pk}/agreement/"] = None
    return pages


class MarkupFromContent(HTMLParser):
    """Collects what in a page could only have come from unescaped trace text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.in_head = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "head":
            self.in_head = True
        elif tag == "body":
            self.in_head = False
        src = attributes.get("src") or ""
        own_script = tag == "script" and self.in_head and src.startswith("/static/")
        own_head_tag = self.in_head and tag in ("meta", "link")
        if tag in FORBIDDEN_TAGS and not (own_script or own_head_tag):
            self.problems.append(f"<{tag}> {attrs}")
        for name, value in attrs:
            if name == "formaction" and tag == "button" and _is_own_path(value or ""):
                continue  # the trace list's bulk actions: one form, a button per action
            if name.startswith(("on", "hx-on", "data-hx-on")) or name in ("srcdoc", "formaction"):
                self.problems.append(f"<{tag} {name}={value!r}>")
        htmx = {name: value for name, value in attrs if name.startswith(("hx-", "data-hx-"))}
        if htmx and not _is_own_htmx(tag, attributes):
            self.problems.append(f"<{tag}> with {htmx}")
        if tag == "a" and "href" in attributes and not _is_safe_url(attributes["href"] or ""):
            self.problems.append(f"<a href={attributes['href']!r}>")

    def handle_endtag(self, tag):
        if tag == "head":
            self.in_head = False


def _is_own_htmx(tag: str, attributes: dict) -> bool:
    """The dashboard's own htmx: the body's CSRF header, forms and links that enhance themselves."""
    if tag == "body":
        return set(attributes) == {"hx-headers"}
    if tag == "form":
        return attributes.get("hx-post", attributes.get("hx-get")) == attributes.get("action")
    if tag == "a":
        return attributes.get("hx-get") == attributes.get("href")
    return False


def _is_own_path(url: str) -> bool:
    """A path on the dashboard's own site (as {% url %} writes it), not another origin's."""
    return url.startswith("/p/") and not urlsplit(url).netloc and "\\" not in url


def _is_safe_url(href: str) -> bool:
    # Browsers drop tabs and newlines inside a URL before reading its scheme.
    cleaned = href.strip().replace("\t", "").replace("\n", "").replace("\r", "")
    return urlsplit(cleaned).scheme.lower() in SAFE_URL_SCHEMES


def test_no_payload_reaches_the_html_unescaped(bob, payload_pages):
    client = Client()
    client.force_login(bob)
    for url in payload_pages:
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        for payload in PAYLOADS:
            if "<" in payload:
                assert payload not in html, (url, payload)
                assert _no_slash(payload) not in html, (url, payload)
        parser = MarkupFromContent()
        parser.feed(html)
        assert parser.problems == [], url


# --- in the browser ---------------------------------------------------------------------------

# Runs before any page script (and outside the page's CSP), to record what the CSP had to block.
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""

FIND_INJECTED_MARKUP = """
() => {
  const problems = [];
  const forbidden = new Set(["SCRIPT", "IFRAME", "FRAME", "OBJECT", "EMBED", "SVG", "MATH",
                             "IMG", "STYLE", "BASE", "LINK", "META", "MGLYPH"]);
  for (const element of document.body.querySelectorAll("*")) {
    if (forbidden.has(element.tagName.toUpperCase())) problems.push(element.outerHTML.slice(0, 80));
    for (const attribute of element.attributes) {
      const name = attribute.name.toLowerCase();
      if (name.startsWith("on") || name.includes("hx-on") || name === "srcdoc") {
        problems.push(element.tagName + " " + name);
      }
    }
    if (element.tagName === "A" && element.hasAttribute("href")
        && !["http:", "https:", "mailto:"].includes(element.protocol)) {
      problems.push("link to " + element.getAttribute("href"));
    }
  }
  for (const element of document.querySelectorAll("[hx-get], [hx-post], [hx-trigger]")) {
    const target = element.getAttribute("hx-get") || element.getAttribute("hx-post");
    const own = element.getAttribute("action") || element.getAttribute("href");
    if (target !== own) problems.push(element.outerHTML.slice(0, 80));
  }
  // Text the templates escape must stay text (bar the <br> of linebreaksbr) ...
  for (const element of document.querySelectorAll(
      ".turn pre, .tool-call header strong, .tool-call header small, .feedback > p, .review pre,"
      + " .tag, .trace-head h1, .turn > header .name, #trace-rows td.preview,"
      + " .feedback-source, .claimed-author")) {
    for (const child of element.querySelectorAll(":not(br)")) {
      problems.push("inside " + element.tagName + ": " + child.outerHTML.slice(0, 80));
    }
  }
  // ... and rendered markdown holds only the sanitizer's allowlist.
  const markdownTags = new Set(["P", "BR", "STRONG", "EM", "CODE", "PRE", "BLOCKQUOTE", "UL",
    "OL", "LI", "H1", "H2", "H3", "H4", "H5", "H6", "HR", "A", "TABLE", "THEAD", "TBODY", "TR",
    "TH", "TD"]);
  for (const element of document.querySelectorAll(".markdown *")) {
    if (!markdownTags.has(element.tagName)) {
      problems.push("markdown " + element.outerHTML.slice(0, 80));
    }
  }
  return problems;
}
"""


@pytest.mark.slow
def test_no_payload_runs_or_becomes_markup_in_the_browser(
    context, bob_page, live_server, payload_pages
):
    page: Page = bob_page
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    dialogs, errors, foreign_requests = [], [], []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("pageerror", lambda error: errors.append(str(error)))

    def record_foreign_request(request) -> None:
        """Anything but the page itself, its static files, the nav's alert count (the Monitors
        link loads it) and a trace page's similar-traces block: <img src>, htmx fired by
        content."""
        hx_target = request.headers.get("hx-target")
        own = (
            request.is_navigation_request()
            or request.url.startswith(f"{live_server.url}/static/")
            or (
                request.url == f"{live_server.url}/p/acme/monitors/" and hx_target == "nav-monitors"
            )
            or (
                request.url == page.url.split("?")[0] + "similar/" and hx_target == "similar-traces"
            )
        )
        if not own:
            foreign_requests.append(request.url)

    page.on("request", record_foreign_request)
    for url, payload in payload_pages.items():
        page.goto(url)  # returns after "load": deferred scripts and htmx's first pass are done
        assert page.evaluate("typeof window.__xss") == "undefined", url
        assert page.evaluate("window.__cspViolations") == [], url
        assert page.evaluate(FIND_INJECTED_MARKUP) == [], url
        assert (dialogs, errors, foreign_requests) == ([], [], []), url
        if payload is not None:
            _assert_payload_shown_as_text(page, payload)


def _assert_payload_shown_as_text(page: Page, payload: str) -> None:
    """A trace's page shows its payload, character for character, where it shows plain text."""
    expect(page.locator("#turn-1 pre.text")).to_have_text(payload)
    expect(page.locator(".tool-call .result pre")).to_have_text(payload)
    expect(page.locator(".feedback > p").first).to_have_text(payload)
    if payload.startswith("<"):  # markdown keeps raw HTML as text
        expect(page.locator("#turn-4 .markdown")).to_contain_text(payload.split(" ")[0])
