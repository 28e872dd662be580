"""Way-finding on every page: the nav marks the section shown, a skip link comes first, the
keyboard sheet is named in the footer, and every page title is the one page-header."""

import html
import json
import re
from pathlib import Path

import pytest
from django.test import Client

from reviewapp.projects.services import create_api_key
from reviewapp.traces.models import Tag

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
CSS = Path(__file__).resolve().parents[2] / "static" / "css"


def page_for(user, url: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def current_links(html: str) -> list[str]:
    return re.findall(r'<a [^>]*aria-current="page"[^>]*>([^<]+)</a>', html)


@pytest.mark.parametrize(
    ("url", "section"),
    [
        ("/p/acme/traces/", "Traces"),
        ("/p/acme/queues/", "Queues"),
        ("/p/acme/queues/new/", "Queues"),
        ("/p/acme/tags/", "Tags"),
        ("/p/acme/retrain/", "Retrain"),
        ("/p/acme/monitors/", "Monitors"),
        ("/p/acme/dataset/", "Training data"),
        ("/p/acme/members/", "Members"),
    ],
)
def test_the_nav_marks_the_section_shown_and_only_it(alice, url, section):
    assert current_links(page_for(alice, url)) == [section]


def test_a_page_outside_the_nav_marks_nothing(alice, bob):
    assert current_links(page_for(alice, "/p/acme/keys/")) == ["API keys"]
    assert current_links(page_for(bob, "/p/acme/targets/")) == ["Targets"]


def test_the_skip_link_is_the_first_link_and_leads_to_the_main_content(bob):
    html = page_for(bob, "/p/acme/traces/")

    body = html[html.index("<body") :]
    first_focusable = re.search(r"<(a|button|input|select|textarea|summary)\b[^>]*>", body)
    assert first_focusable.group(0) == '<a class="skip-link" href="#main">'
    assert '<main id="main" tabindex="-1">' in html


def test_the_footer_names_the_keyboard_sheet_and_opens_it(bob):
    html = page_for(bob, "/p/acme/traces/")

    footer = html[html.index('<footer class="page-foot">') :]
    assert 'data-opens="keymap"' in footer and "<kbd>?</kbd>" in footer
    assert '<dialog id="keymap">' in html


def test_no_text_in_the_stylesheets_is_set_below_12_px():
    sizes = []
    for sheet in CSS.glob("*.css"):
        sizes += [
            float(size) for size in re.findall(r"font[^;{}]*?(\d+(?:\.\d+)?)px", sheet.read_text())
        ]
    assert sizes and min(sizes) >= 12


def test_page_titles_come_from_the_page_header_and_nowhere_sizes_them_apart():
    own_h1 = [
        str(path.relative_to(TEMPLATES))
        for path in TEMPLATES.glob("*/*.html")
        if path.parent.name in ("traces", "review") and "<h1" in path.read_text()
    ]
    assert own_h1 == []
    css = "".join(sheet.read_text() for sheet in CSS.glob("*.css"))
    assert re.findall(r"h1[^{]*\{[^}]*font-size", css) == ["h1 { font-size"]


@pytest.mark.parametrize(
    ("url", "action", "question"),
    [
        ("/p/acme/keys/", "/revoke/", "Revoke the key harness?"),
        ("/p/acme/members/", "/remove/", "Remove bob from Acme support agent?"),
        ("/p/acme/tags/", "/delete/", "Delete the tag slow?"),
        ("/p/acme/tags/", "/merge/", "Merge slow into the chosen tag?"),
        ("/p/acme/retrain/", "/p/acme/retrain/", "Start a training run on what is approved?"),
    ],
)
def test_forms_that_destroy_or_start_costly_work_ask_first(
    project, alice, bob, url, action, question
):
    create_api_key(project=project, name="harness")
    Tag.objects.create(project=project, name="slow")
    Tag.objects.create(project=project, name="late")

    forms = re.findall(r"<form [^>]*>", page_for(alice, url))

    asking = [form for form in forms if re.search(f'action="[^"]*{re.escape(action)}"', form)]
    assert asking and all('data-confirm="' in form for form in asking)
    assert any(f'data-confirm="{question}' in form for form in asking)


def test_htmx_is_told_never_to_set_an_inline_style(bob):
    page = page_for(bob, "/p/acme/traces/")

    config = json.loads(
        html.unescape(re.search(r'name="htmx-config" content=\'([^\']+)\'', page)[1])
    )
    assert config["includeIndicatorStyles"] is False
    assert "style" not in config["attributesToSettle"]
