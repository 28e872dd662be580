"""Long gateway episodes: each message stored once, requests by reference, summaries kept
incrementally, the body packed and the trace triaged once the episode goes quiet."""

import hashlib
import importlib
import random
import string
import threading
import zlib
from datetime import timedelta

import orjson
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from reviewapp import jobs
from reviewapp.gateway import calls, conversation, tasks
from reviewapp.gateway.calls import RecordedCall, record_model_call, record_model_calls
from reviewapp.gateway.conversation import canonical_message
from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import CallRecorder
from reviewapp.traces import ingest
from reviewapp.traces.facts import facts_of
from reviewapp.traces.ingest import search_text
from reviewapp.traces.models import Trace, TraceSegment, tools_shown

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}},
]


def tool_output(rng: random.Random, turn: int) -> str:
    """About 1 KB that does not compress away, sometimes an error."""
    text = "".join(rng.choices(string.ascii_letters + " \n", k=1000))
    return ("Error: file not found\n" if turn % 7 == 3 else "") + text


def answer(turn: int, *, final: bool = False) -> dict:
    if final:
        return {"role": "assistant", "content": f"Done after {turn} steps."}
    name = TOOLS[turn % 2]["function"]["name"]
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call-{turn}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps({"turn": turn}).decode()},
            }
        ],
    }


def call_of(project, messages: list[dict], reply: dict, *, trace_id: str = "", at=None):
    return RecordedCall(
        project_id=project.pk,
        trace_id_header=trace_id,
        requested_model="agent",
        upstream_model="agent",
        adapter_version="",
        upstream_url="http://127.0.0.1:9/v1",
        stream=False,
        request={"model": "agent", "messages": list(messages), "tools": TOOLS, "temperature": 0},
        response={
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2},
        },
        status_code=200,
        termination="completed",
        error="",
        # A recorded call has ended by the time it is recorded: started 5 ms ago, took 5 ms.
        started_at=at or timezone.now() - timedelta(milliseconds=5),
        latency_ms=5.0,
        time_to_first_token_ms=None,
    )


def run_episode(project, turns: int, *, trace_id: str = "") -> tuple[list[dict], list]:
    """An agent loop through record_model_call: each turn sends the whole conversation plus
    the last tool's output. Returns the final conversation and the calls sent."""
    rng = random.Random(7)
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    sent = []
    for turn in range(turns):
        reply = answer(turn, final=turn == turns - 1)
        call = call_of(project, messages, reply, trace_id=trace_id)
        record_model_call(call)
        sent.append(call)
        messages = [*messages, reply]
        if turn < turns - 1:
            messages.append(
                {"role": "tool", "tool_call_id": f"call-{turn}", "content": tool_output(rng, turn)}
            )
    return messages, sent


def stored_bytes() -> int:
    """What the episode occupies: bodies, segments, calls' requests and responses, summaries."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT coalesce(sum(octet_length(body) + octet_length(search_text)"
            "   + octet_length(recording::text)), 0) FROM reviewapp_trace)"
            " + (SELECT coalesce(sum(octet_length(messages)), 0) FROM reviewapp_tracesegment)"
            " + (SELECT coalesce(sum(octet_length(request) + coalesce(octet_length(response), 0)),"
            "   0) FROM reviewapp_modelcall)"
        )
        return cursor.fetchone()[0]


def asked_to_settle(enqueued) -> list[int]:
    """The traces the recorder asked to settle, one entry per trace asked for."""
    return [trace_id for (trace_ids,) in enqueued.of(jobs.SETTLE_TRACES) for trace_id in trace_ids]


@pytest.mark.django_db
def test_a_long_episode_is_stored_once_not_once_per_call(project, enqueued):
    messages, _ = run_episode(project, 60)

    conversation = len(orjson.dumps(messages))
    # Storing every request whole would be about 30 conversations here.
    assert stored_bytes() <= 1.5 * conversation
    trace = Trace.objects.get()
    assert trace.calls.count() == 60
    assert TraceSegment.objects.filter(trace=trace).count() == 60


@pytest.mark.django_db
def test_readers_see_the_whole_conversation_before_and_after_it_settles(
    project, enqueued, settings, django_capture_on_commit_callbacks
):
    messages, _ = run_episode(project, 12, trace_id="episode-9")
    trace = Trace.objects.get()
    assert trace.body_json() == {"messages": messages, "tools": TOOLS}

    settings.GATEWAY_QUIET_SECONDS = 0
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.settle_trace(trace.pk) is True
    trace.refresh_from_db()
    assert not TraceSegment.objects.filter(trace=trace).exists()
    assert orjson.loads(zlib.decompress(trace.body))["messages"] == messages
    assert trace.body_json() == {"messages": messages, "tools": TOOLS}


@pytest.mark.django_db
def test_the_trace_page_and_the_api_show_messages_still_in_segments(
    project, enqueued, api, client, bob
):
    messages, _ = run_episode(project, 6, trace_id="episode-4")
    trace = Trace.objects.get()
    assert TraceSegment.objects.filter(trace=trace).exists()  # not settled yet

    stored = api.get("/api/v1/traces/episode-4").json()
    assert stored["messages"] == messages and stored["tools"] == TOOLS
    client.force_login(bob)
    page = client.get(f"/p/{project.slug}/traces/{trace.pk}/").content.decode()
    assert "Done after 5 steps." in page and messages[-2]["content"][:40] in page


@pytest.mark.django_db
def test_summary_columns_match_the_whole_conversation(project, enqueued):
    messages, _ = run_episode(project, 25)
    trace = Trace.objects.get()

    assert trace.message_count == len(messages)
    assert trace.tool_call_count == 24
    assert trace.preview == "Fix the failing test."
    assert trace.search_text == search_text(messages)
    facts = facts_of(messages)
    assert (trace.tool_results, trace.tool_errors) == (facts.tool_results, facts.tool_errors)
    assert (trace.answer_count, trace.answer_words) == (facts.answer_count, facts.answer_words)
    assert trace.prompt_tokens == 250 and trace.completion_tokens == 50


@pytest.mark.django_db
def test_an_answer_straight_after_a_failed_tool_result_is_counted_as_it_is_recorded(
    project, enqueued
):
    messages, _ = run_episode(project, 26)  # the last tool result, turn 24's, is an error
    trace = Trace.objects.get()

    assert messages[-2]["content"].startswith("Error:")
    assert trace.answers_after_tool_error == facts_of(messages).answers_after_tool_error == 1


@pytest.mark.django_db
def test_search_text_kept_incrementally_is_the_whole_conversation_s_when_cut(
    project, enqueued, monkeypatch
):
    monkeypatch.setattr(calls, "SEARCH_TEXT_MAX_CHARS", 3000)
    monkeypatch.setattr(ingest, "SEARCH_TEXT_MAX_CHARS", 3000)
    messages, _ = run_episode(project, 30)  # errors at turns 3, 10, 17, 24: 4,000 characters

    assert Trace.objects.get().search_text == search_text(messages)


@pytest.mark.parametrize("trace_id", ["episode-3", ""], ids=["X-Trace-Id", "prefix merging"])
@pytest.mark.django_db
def test_a_late_call_canonicalises_only_its_new_messages(project, enqueued, monkeypatch, trace_id):
    messages, _ = run_episode(project, 40, trace_id=trace_id)
    canonicalised = []
    original = conversation.canonical_message
    monkeypatch.setattr(
        conversation, "canonical_message", lambda m: canonicalised.append(m) or original(m)
    )
    following = [*messages, {"role": "user", "content": "Now the other test."}]
    record_model_call(call_of(project, following, answer(40), trace_id=trace_id))

    # The re-sent answer, the new question and the new answer: not the 79 messages before them.
    assert len(canonicalised) <= 3
    assert Trace.objects.get().message_count == len(following) + 1


@pytest.mark.django_db
def test_each_call_s_request_is_rebuilt_from_the_trace(project, enqueued):
    _, sent = run_episode(project, 8)

    calls = list(ModelCall.objects.order_by("id"))
    assert [call.request_json() for call in calls] == [call.request for call in sent]
    assert [call.turn_index for call in calls] == [2, 4, 6, 8, 10, 12, 14, 16]
    assert calls[-1].request_prefix == len(sent[-1].request["messages"])


@pytest.mark.django_db
def test_a_call_that_rewrites_history_appends_as_before_and_keeps_its_request(project, enqueued):
    first = [{"role": "user", "content": "Plan the trip."}]
    record_model_call(call_of(project, first, answer(0), trace_id="t"))
    # The harness summarised its history: a different first message, same trace id.
    rewritten = [{"role": "user", "content": "Summary: plan the trip."}]
    record_model_call(call_of(project, rewritten, answer(1), trace_id="t"))

    trace = Trace.objects.get()
    assert trace.body_json()["messages"] == [*first, answer(0), *rewritten, answer(1)]
    call = ModelCall.objects.order_by("id").last()
    assert call.request_prefix == 0 and call.turn_index == 3
    assert call.request_json()["messages"] == rewritten


@pytest.mark.django_db
def test_an_answer_re_sent_with_cosmetic_changes_is_not_stored_again(project, enqueued):
    messages = [{"role": "user", "content": "Go."}]
    for turn in range(4):
        record_model_call(call_of(project, messages, answer(turn), trace_id="t"))
        # The harness's copy of the answer: content "" for null, an extra key.
        resent = {**answer(turn), "content": "", "refusal": None}
        messages = [*messages, resent, {"role": "tool", "tool_call_id": f"call-{turn}",
                                        "content": f"result {turn}"}]  # fmt: skip

    stored = Trace.objects.get().body_json()["messages"]
    assert len(stored) == 1 + 4 * 2 - 1
    assert stored[1] == answer(0)  # the trace keeps the answer as the model gave it
    assert all(call.request_prefix == 1 + 2 * i for i, call in enumerate(
        ModelCall.objects.order_by("id")))  # fmt: skip


@pytest.mark.django_db
def test_an_earlier_message_edited_in_place_is_noticed(project, enqueued):
    messages, _ = run_episode(project, 5, trace_id="t")
    edited = [dict(message) for message in messages]
    edited[1]["content"] = "Fix the failing test, and be quick."  # same length of history
    record_model_call(call_of(project, edited, answer(9), trace_id="t"))

    stored = Trace.objects.get().body_json()["messages"]
    assert stored == [*messages, *edited[1:], answer(9)]  # appended after, as before


@pytest.mark.django_db
def test_a_new_tool_joins_the_trace_and_each_call_keeps_the_tools_it_sent(project, enqueued):
    messages = [{"role": "user", "content": "Go."}]
    record_model_call(call_of(project, messages, answer(0), trace_id="t"))
    more = [*TOOLS, {"type": "function", "function": {"name": "deploy"}}]
    later = call_of(project, [*messages, answer(0)], answer(1), trace_id="t")
    later.request["tools"] = more
    record_model_call(later)

    assert Trace.objects.get().body_json()["tools"] == more
    first, second = ModelCall.objects.order_by("id")
    assert first.request_json()["tools"] == TOOLS
    assert second.request_json()["tools"] == more


@pytest.mark.django_db
def test_an_answer_asked_for_without_tools_is_recorded_as_shown_none(project, enqueued):
    """The demo agent's shape: a call offering tools, then the answer under tool_choice "none"
    (vLLM renders that prompt without the definitions), then one sending no tools at all."""
    messages = [{"role": "user", "content": "Run the tests."}]
    record_model_call(call_of(project, messages, answer(0), trace_id="t"))
    messages = [*messages, answer(0), {"role": "tool", "tool_call_id": "call-0", "content": "ok"}]
    under_none = call_of(project, messages, answer(1, final=True), trace_id="t")
    under_none.request["tool_choice"] = "none"
    record_model_call(under_none)
    messages = [*messages, answer(1, final=True), {"role": "user", "content": "Thanks."}]
    without_tools = call_of(project, messages, answer(2, final=True), trace_id="t")
    del without_tools.request["tools"]
    record_model_call(without_tools)
    trace = Trace.objects.get()
    calls.settle_traces(trace_ids=[trace.pk], force=True)  # packed: still known

    body = Trace.objects.get().body_json()
    assert [tools_shown(body, turn) for turn in (1, 3, 5)] == [TOOLS, None, None]
    assert body["tools"] == TOOLS  # the trace's tools are unchanged


@pytest.mark.django_db
def test_a_pushed_trace_shows_its_tools_at_every_turn(project):
    ingest.ingest_traces(project=project, raw_items=[{"external_id": "pushed", "tools": TOOLS,
        "messages": [{"role": "user", "content": "Go."}, answer(0, final=True)]}])  # fmt: skip

    assert tools_shown(Trace.objects.get().body_json(), 1) == TOOLS


@pytest.mark.django_db
def test_prefix_merging_finds_the_trace_without_a_header(project, enqueued):
    messages, _ = run_episode(project, 6)
    assert Trace.objects.count() == 1
    assert Trace.objects.get().message_count == len(messages)


@pytest.mark.django_db
def test_a_quiet_episode_asks_for_one_settle_and_settles_once(
    project, enqueued, settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        run_episode(project, 10, trace_id="busy")
    trace = Trace.objects.get()
    assert asked_to_settle(enqueued) == [trace.pk]  # ten calls, one settle task
    # Recording alone triages and embeds nothing.
    assert enqueued.of(jobs.TRIAGE_TRACES) == enqueued.of(jobs.EMBED_TRACES) == []

    # Still busy when the task comes: it waits again and nothing runs yet.
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.settle_trace(trace.pk) is False
    assert asked_to_settle(enqueued) == [trace.pk, trace.pk]
    assert enqueued.of(jobs.TRIAGE_TRACES) == []

    Trace.objects.filter(pk=trace.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.settle_trace(trace.pk) is True
    assert enqueued.of(jobs.TRIAGE_TRACES) == enqueued.of(jobs.EMBED_TRACES) == [([trace.pk],)]

    # A call after it settled starts the next quiet period.
    with django_capture_on_commit_callbacks(execute=True):
        messages = trace.body_json()["messages"]
        record_model_call(call_of(project, messages, answer(99), trace_id="busy"))
    assert asked_to_settle(enqueued) == [trace.pk, trace.pk, trace.pk]


@pytest.mark.django_db
def test_a_batch_of_calls_is_one_transaction_with_one_insert_per_table(project, enqueued):
    messages = [{"role": "user", "content": "Start."}]
    batch = []
    for turn in range(20):
        batch.append(call_of(project, messages, answer(turn), trace_id="t"))
        messages = [*messages, answer(turn), {"role": "tool", "tool_call_id": f"call-{turn}",
                                               "content": "ok"}]  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        record_model_calls(batch)

    inserts = [q["sql"] for q in queries if q["sql"].startswith("INSERT")]
    assert sum("reviewapp_modelcall" in sql for sql in inserts) == 1
    assert sum("reviewapp_tracesegment" in sql for sql in inserts) == 1
    # per call: find and update the trace; per batch: 4, and 5 to keep the monitors' rollups
    assert len(queries) <= 2 * 20 + 4 + 5
    assert Trace.objects.get().message_count == len(messages) - 1


@pytest.mark.django_db(transaction=True)
def test_the_recorder_writes_what_queued_up_and_skips_only_a_call_it_cannot_store(
    project, enqueued
):
    recorder = CallRecorder()
    gate = threading.Event()
    original = recorder._write

    def write_after_gate(batch):
        gate.wait(5)
        original(batch)

    recorder._write = write_after_gate
    messages = [{"role": "user", "content": "Start."}]
    for turn in range(5):
        recorder.submit(call_of(project, messages, answer(turn), trace_id="t"))
        messages = [*messages, answer(turn)]
    broken = call_of(project, messages, answer(9), trace_id="gone")
    broken.project_id = project.pk + 1000  # no such project: this call cannot be stored
    recorder.submit(broken)
    gate.set()

    assert recorder.wait_until_idle(10)
    assert ModelCall.objects.count() == 5
    assert Trace.objects.get().message_count == 6


@pytest.mark.django_db
def test_a_trace_recorded_before_segments_is_continued_by_the_next_call(project, enqueued):
    """Stored whole, with the old tail hash and no bookkeeping: the upgrade's migration rehashes
    it, and the next call (no header: prefix merging) joins it and appends only its news."""
    from django.apps import apps

    rehash = importlib.import_module("reviewapp.migrations.0019_gateway_chain_tail_hash")
    messages = [{"role": "user", "content": "Go."}, answer(0)]
    old_hash = hashlib.sha256(orjson.dumps([canonical_message(m) for m in messages])).hexdigest()
    trace = Trace.objects.create(
        project=project, external_id="gw-old", source="gateway", model="agent",
        body=Trace.pack_body(messages=messages, tools=TOOLS), content_hash=old_hash,
        tail_hash=old_hash, message_count=2, tool_call_count=1, preview="Go.",
        search_text=search_text(messages), updated_at=timezone.now(),
    )  # fmt: skip
    rehash.rehash_recent_gateway_traces(apps, None)

    following = [*messages, {"role": "tool", "tool_call_id": "call-0", "content": "Error: no"}]
    record_model_call(call_of(project, following, answer(1)))

    trace.refresh_from_db()
    assert Trace.objects.count() == 1
    assert trace.body_json() == {"messages": [*following, answer(1)], "tools": TOOLS}
    assert trace.search_text == search_text([*following, answer(1)])
    assert ModelCall.objects.get().request_json()["messages"] == following
