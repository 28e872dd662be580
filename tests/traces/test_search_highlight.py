"""The trace list shows where a text search matched: a snippet with the match in <mark>."""

import pytest
from django.test import Client

from reviewapp.traces.filters import SNIPPET_CHARS, match_snippet
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace

TOOL_ERROR = "Error: ledger service returned 503 (shard 7 unreachable) while booking the refund"


def with_tool_output(external_id: str, output: str) -> dict:
    trace = make_trace(external_id)
    trace["messages"][3]["content"] = output
    return trace


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


def listed(client: Client, **params) -> str:
    response = client.get("/p/acme/traces/", params)
    assert response.status_code == 200
    return response.content.decode()


def test_a_tool_error_found_by_search_is_shown_with_the_match_marked(bob_client, project):
    ingest_traces(
        project=project, raw_items=[with_tool_output("broken", TOOL_ERROR), make_trace("fine")]
    )

    html = listed(bob_client, q="SHARD 7 unreachable")

    assert '<div class="match">' in html
    assert "returned 503 (<mark>shard 7 unreachable</mark>) while booking" in html
    assert "fine" not in html


def test_html_next_to_the_match_is_escaped(bob_client, project):
    output = "Error: <script>alert(1)</script> ledger shard 7 unreachable <b>bold</b>"
    ingest_traces(project=project, raw_items=[with_tool_output("hostile", output)])

    html = listed(bob_client, q="shard 7")

    assert "<script>alert(1)</script>" not in html
    assert "<b>bold</b>" not in html
    assert (
        "Error: &lt;script&gt;alert(1)&lt;/script&gt; ledger <mark>shard 7</mark> unreachable"
        " &lt;b&gt;bold&lt;/b&gt;" in html
    )


def test_html_in_the_matched_text_itself_is_escaped(bob_client, project):
    output = "Error: the tool printed <img src=x onerror=alert(1)> and stopped"
    ingest_traces(project=project, raw_items=[with_tool_output("hostile", output)])

    html = listed(bob_client, q="<img src=x")

    assert "<img src=x" not in html
    assert "<mark>&lt;img src=x</mark> onerror=alert(1)&gt;" in html


def test_a_match_in_the_first_user_message_is_marked_in_its_place(bob_client, project):
    trace = make_trace("flight")
    trace["messages"][1]["content"] = "Book a flight to Oslo on Friday"
    ingest_traces(project=project, raw_items=[trace])

    html = listed(bob_client, q="oslo")

    assert "Book a flight to <mark>Oslo</mark> on Friday" in html
    assert '<div class="match">' not in html  # not shown twice


def test_without_a_search_the_list_marks_nothing(bob_client, project):
    ingest_traces(project=project, raw_items=[with_tool_output("broken", TOOL_ERROR)])

    html = listed(bob_client)

    assert "<mark>" not in html
    assert TOOL_ERROR not in html  # the tool output is not on the list without a search


def test_a_trace_found_by_its_id_alone_has_no_snippet(bob_client, project):
    ingest_traces(project=project, raw_items=[make_trace("run-424242")])

    html = listed(bob_client, q="424242")

    assert "run-424242" in html
    assert "<mark>" not in html


def test_the_snippet_is_a_window_around_the_first_match():
    text = "a" * 500 + " needle, and a second NEEDLE " + "b" * 500

    snippet = str(match_snippet(text, "Needle"))

    assert snippet.count("<mark>") == 1
    assert snippet.startswith("…a") and snippet.endswith("b…")
    shown = snippet.replace("<mark>", "").replace("</mark>", "")
    assert len(shown) == SNIPPET_CHARS + 2  # and the two ellipses


def test_the_snippet_gives_unused_room_on_one_side_to_the_other():
    text = "needle at the start, " + "then words " * 40

    snippet = str(match_snippet(text, "needle"))

    assert snippet.startswith("<mark>needle</mark> at the start")
    assert len(snippet.replace("<mark>", "").replace("</mark>", "")) == SNIPPET_CHARS + 1


def test_no_snippet_when_the_text_does_not_contain_the_query():
    assert match_snippet("nothing to see", "needle") is None
