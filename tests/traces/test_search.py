"""Text search finds assistant answers and tool errors, not only the id and first user message."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test import Client

from reviewapp.gateway.calls import RecordedCall, record_model_call
from reviewapp.traces.ingest import SEARCH_TEXT_MAX_CHARS, ingest_traces, search_text
from tests.factories import make_trace


def tool_failure_trace(external_id: str) -> dict:
    trace = make_trace(external_id)
    trace["messages"][3]["content"] = "Error: inventory service refused the connection"
    trace["messages"][4]["content"] = "I could not reach the warehouse, sorry."
    return trace


@pytest.fixture
def traces(project):
    ingest_traces(project=project, raw_items=[tool_failure_trace("broken"), make_trace("fine")])


def listed(client, **params) -> str:
    return client.get("/p/acme/traces/", params).content.decode()


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


def test_the_list_finds_text_in_an_assistant_answer(bob_client, traces):
    html = listed(bob_client, q="WAREHOUSE")
    assert "broken" in html
    assert "fine" not in html


def test_the_list_finds_a_tool_error_message(bob_client, traces):
    html = listed(bob_client, q="refused the connection")
    assert "broken" in html
    assert "fine" not in html


def test_the_api_finds_a_tool_error_message(api, traces):
    found = api.get("/api/v1/traces", q="inventory service").json()["traces"]
    assert [trace["external_id"] for trace in found] == ["broken"]


def test_the_api_finds_an_answer_recorded_by_the_gateway(api, project):
    record_model_call(
        RecordedCall(
            project_id=project.pk,
            trace_id_header="gw-episode",
            requested_model="shop-agent",
            upstream_model="base-model",
            adapter_version="",
            upstream_url="http://model.invalid/v1",
            stream=False,
            request={"model": "shop-agent", "messages": [{"role": "user", "content": "Hi"}]},
            response={"choices": [{"message": {"role": "assistant", "content": "Bonjour Lyon"}}]},
            status_code=200,
            termination="completed",
            error="",
            started_at=datetime(2026, 12, 1, tzinfo=UTC),
            latency_ms=50.0,
            time_to_first_token_ms=None,
        )
    )
    found = api.get("/api/v1/traces", q="lyon").json()["traces"]
    assert [trace["external_id"] for trace in found] == ["gw-episode"]


def test_tool_errors_are_kept_first_when_the_text_is_cut():
    messages = [
        {"role": "assistant", "content": "word " * SEARCH_TEXT_MAX_CHARS},
        {"role": "tool", "tool_call_id": "c", "content": "Error: disk full"},
    ]
    text = search_text(messages)
    assert len(text) == SEARCH_TEXT_MAX_CHARS
    assert text.startswith("Error: disk full")


def test_postgresql_serves_the_search_from_a_trigram_index(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'trace_search_text_trgm'")
        [(definition,)] = cursor.fetchall()
    assert "gin_trgm_ops" in definition
    assert "upper" in definition.lower()
