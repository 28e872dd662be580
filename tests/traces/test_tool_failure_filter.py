"""'Which traces hit a tool failure?': the tool-call filters, the list's count of matches, and
the monitors' figures opening exactly the traces they count."""

import html as html_module
import re

import pytest
from django.test import Client

from reviewapp.monitors import monitors
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace

LOOKUP_FAILED = "Error: order service returned 503"


def episode(external_id: str, *, failed_lookups: int, termination: str, calculator_failed=False):
    """A support episode: `failed_lookups` failed order lookups, then (unless the episode ended
    in the tool error) a last lookup that worked and an answer."""
    trace = make_trace(external_id, termination=termination)
    user = trace["messages"][:2]
    calls = []
    for index in range(failed_lookups):
        calls.append(("lookup_order", LOOKUP_FAILED, f"lookup_{index}"))
    if calculator_failed:
        calls.append(("calculator", "Error: division by zero", "calc"))
    if termination != "tool_error":
        calls.append(("lookup_order", '{"status": "shipped"}', "lookup_ok"))
    messages = list(user)
    for name, result, call_id in calls:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": '{"order": "A-1"}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    if termination != "tool_error":
        messages.append({"role": "assistant", "content": "Your order has shipped."})
    trace["messages"] = messages
    return trace


@pytest.fixture
def demo(project):
    """13 failed lookups in 9 traces: 3 recovered and completed, 6 ended in the tool error;
    5 clean traces; one completed trace whose calculator failed."""
    items = [
        *(episode(f"recovered-{i}", failed_lookups=2 if i < 2 else 1, termination="completed")
          for i in range(3)),
        *(episode(f"ended-{i}", failed_lookups=2 if i < 2 else 1, termination="tool_error")
          for i in range(6)),
        *(episode(f"clean-{i}", failed_lookups=0, termination="completed") for i in range(5)),
    ]  # fmt: skip
    ingest_traces(project=project, raw_items=items)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listed_ids(client, query: str) -> set[str]:
    page = client.get(f"/p/acme/traces/?{query}").content.decode()
    return set(re.findall(r">((?:recovered|ended|clean|calc)-\d+)</a>", page))


def match_count(client, query: str) -> int:
    page = client.get(f"/p/acme/traces/?{query}").content.decode()
    return int(re.search(r'id="match-count"><strong>(\d+)</strong>', page).group(1))


def test_a_lookup_that_failed_before_the_agent_completed_is_found_by_the_tool_failure_filter(
    bob, demo
):
    client = logged_in(bob)
    failed = listed_ids(client, "tool_failure=yes")
    assert {"recovered-0", "recovered-1", "recovered-2"} <= failed
    assert len(failed) == 9 and not any(name.startswith("clean") for name in failed)
    # The termination filter answers another question: how the episode ended.
    ended = listed_ids(client, "termination=tool_error")
    assert len(ended) == 6 and not any(name.startswith("recovered") for name in ended)


def test_none_failed_lists_the_clean_traces(bob, demo):
    assert listed_ids(logged_in(bob), "tool_failure=no") == {f"clean-{i}" for i in range(5)}


def test_a_named_tool_finds_only_the_traces_where_that_tool_failed(bob, project, demo):
    ingest_traces(
        project=project,
        raw_items=[
            episode("calc-0", failed_lookups=0, termination="completed", calculator_failed=True)
        ],
    )
    client = logged_in(bob)
    assert listed_ids(client, "failed_tool=calculator") == {"calc-0"}
    assert len(listed_ids(client, "failed_tool=lookup_order")) == 9
    assert listed_ids(client, "failed_tool=no_such_tool") == set()
    # Combined with how it ended: recovered from a failed lookup.
    assert listed_ids(client, "failed_tool=lookup_order&termination=completed") == {
        "recovered-0", "recovered-1", "recovered-2"
    }  # fmt: skip


def test_the_list_counts_every_match_not_only_the_page(bob, project):
    ingest_traces(project=project, raw_items=[make_trace(f"t-{i}") for i in range(53)])
    client = logged_in(bob)
    assert match_count(client, "") == 53
    page = client.get("/p/acme/traces/").content.decode()
    assert "the first 50 below" in page
    assert match_count(client, "termination=timeout") == 0


def test_the_match_count_comes_with_the_htmx_results(bob, demo):
    response = logged_in(bob).get(
        "/p/acme/traces/?tool_failure=yes", headers={"HX-Request": "true"}
    )
    assert "<strong>9</strong> traces match" in response.content.decode()


def _link_of(page: str, text_pattern: str) -> str:
    found = re.search(rf'<a href="([^"]+)">({text_pattern})</a>', page)
    assert found, f"no link reading {text_pattern!r}"
    return html_module.unescape(found.group(1))


@pytest.mark.parametrize("filters", ["", "?q=order"])  # rollups, then sums over the traces
def test_the_monitors_failed_calls_open_the_traces_they_are_in(victor, demo, filters):
    client = logged_in(victor)
    page = client.get(f"/p/acme/monitors/{filters}").content.decode()
    url = _link_of(page, r"[\d.]+% \(13/\d+\) in 9 traces")
    assert "tool_failure=yes" in url
    assert match_count(client, url.split("?", 1)[1]) == 9
    assert len(listed_ids(client, url.split("?", 1)[1])) == 9


@pytest.mark.parametrize("named_tools_max", [32, 0])  # a count per tool; a row per JSON key
def test_the_monitors_errors_per_tool_open_the_traces_with_that_tools_errors(
    victor, demo, monkeypatch, named_tools_max
):
    monkeypatch.setattr(monitors, "NAMED_TOOLS_MAX", named_tools_max)
    client = logged_in(victor)
    page = client.get("/p/acme/monitors/").content.decode()
    url = _link_of(page, r"13 in 9 traces")
    assert "failed_tool=lookup_order" in url
    assert match_count(client, url.split("?", 1)[1]) == 9


def test_the_monitors_failed_episodes_open_exactly_those_traces(victor, project, demo):
    ingest_traces(
        project=project,
        raw_items=[
            make_trace("reported-failed", outcome={"success": False}),
            make_trace("reported-ok", outcome={"success": True}),
        ],
    )
    client = logged_in(victor)
    page = client.get("/p/acme/monitors/").content.decode()
    url = _link_of(page, r"[\d.]+% \(7 failed\)")  # six tool_error endings, one reported
    assert "outcome=failed" in url
    assert match_count(client, url.split("?", 1)[1]) == 7


def test_the_monitors_results_per_tool_open_the_traces_that_called_it(victor, project, demo):
    ingest_traces(project=project, raw_items=[make_trace("calc-1")])  # one calculator result
    client = logged_in(victor)
    page = client.get("/p/acme/monitors/").content.decode()
    found = re.search(r'<a href="([^"]*called_tool=calculator[^"]*)">1</a>', page)
    assert found, "the calculator's one result links to the traces that called it"
    assert listed_ids(client, html_module.unescape(found.group(1)).split("?", 1)[1]) == {"calc-1"}
    assert len(listed_ids(client, "called_tool=lookup_order")) == 14  # every demo episode
