"""The recorder's batches: new traces inserted together, settle tasks asked for together, calls
that arrive close together written in one transaction, and long histories checked in memory."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from reviewapp import jobs
from reviewapp.gateway import calls, conversation, tasks
from reviewapp.gateway import recorder as recorder_module
from reviewapp.gateway.calls import insert_rows, record_model_calls
from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import CallRecorder
from reviewapp.traces.models import Trace, TraceSegment
from tests.gateway.test_gateway_episode import answer, call_of, run_episode


def settle_tasks(enqueued) -> list[tuple[list[int], float]]:
    """The settle tasks asked for: (trace ids, countdown) each."""
    settles = [
        (args, countdown) for name, args, countdown in enqueued if name == jobs.SETTLE_TRACES
    ]
    return [(trace_ids, countdown) for (trace_ids,), countdown in settles]


def first_call(project, number: int, **kwargs):
    """A call that starts a conversation of its own (no header, no earlier answer)."""
    return call_of(project, [{"role": "user", "content": f"Task {number}"}], answer(0), **kwargs)


@pytest.mark.django_db
def test_the_traces_a_batch_starts_are_inserted_in_one_statement_without_a_lookup(
    project, enqueued, monkeypatch
):
    looked_up = []
    original = calls._traces
    monkeypatch.setattr(calls, "_traces", lambda call: looked_up.append(call) or original(call))
    batch = [first_call(project, number) for number in range(20)]
    with CaptureQueriesContext(connection) as queries:
        rows = record_model_calls(batch)

    statements = [query["sql"] for query in queries]
    assert sum(sql.startswith('INSERT INTO "reviewapp_trace"') for sql in statements) == 1
    assert looked_up == []
    assert Trace.objects.count() == 20
    for call, row in zip(batch, rows, strict=True):
        trace = Trace.objects.get(pk=row.trace_id)
        assert trace.body_json()["messages"] == [*call.request["messages"], answer(0)]
        assert ModelCall.objects.get(pk=row.pk).request_json() == call.request


@pytest.mark.parametrize("trace_id", ["t-1", ""], ids=["X-Trace-Id", "prefix merging"])
@pytest.mark.django_db
def test_a_call_continues_a_trace_started_earlier_in_its_batch(
    project, enqueued, trace_id, django_capture_on_commit_callbacks
):
    messages = [{"role": "user", "content": "Go."}]
    later = [*messages, answer(0), {"role": "tool", "tool_call_id": "call-0", "content": "ok"}]
    with django_capture_on_commit_callbacks(execute=True):
        rows = record_model_calls(
            [
                call_of(project, messages, answer(0), trace_id=trace_id),
                first_call(project, 99),  # another conversation in between
                call_of(project, later, answer(1), trace_id=trace_id),
            ]
        )

    assert Trace.objects.count() == 2
    assert rows[0].trace_id == rows[2].trace_id != rows[1].trace_id
    trace = Trace.objects.get(pk=rows[0].trace_id)
    assert trace.body_json()["messages"] == [*later, answer(1)]
    assert trace.message_count == 4
    assert ModelCall.objects.get(pk=rows[2].pk).request_json()["messages"] == later
    # One task for the batch, once it committed.
    first_trace_ids = sorted({rows[0].trace_id, rows[1].trace_id})
    assert [ids for ids, _ in settle_tasks(enqueued)] == [first_trace_ids]


@pytest.mark.django_db
def test_rows_inserted_in_one_statement_read_back_as_the_orm_stores_them(project):
    trace = Trace(
        project=project,
        external_id='quote\'s "and" back\\slash',
        body=b"\x00\x01binary\xff",
        metadata={"nested": {"list": [1, 2.5, None, True]}, "text": 'émoji 🎉 \\ "'},
        search_text="line\nbreak",
    )
    insert_rows([trace])
    row = ModelCall(
        project=project,
        trace=trace,
        requested_model="m",
        upstream_model="m",
        upstream_url="http://127.0.0.1:9/v1",
        request=b"\x00raw",
        response=None,
        termination="completed",
        started_at=timezone.now(),
        latency_ms=1.25,
        has_logprobs=True,
    )
    insert_rows([row])
    twin = ModelCall.objects.create(
        **{f.attname: getattr(row, f.attname) for f in ModelCall._meta.concrete_fields
           if not f.primary_key}
    )  # fmt: skip

    stored = Trace.objects.get(pk=trace.pk)
    for field in Trace._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(trace, field.attname), field.name
    for field in ModelCall._meta.concrete_fields:
        if not field.primary_key:
            mine = getattr(ModelCall.objects.get(pk=row.pk), field.attname)
            assert mine == getattr(ModelCall.objects.get(pk=twin.pk), field.attname), field.name
    assert row.trace_id == trace.pk and not row._state.adding


@pytest.mark.django_db
def test_traces_not_quiet_yet_wait_in_one_task_per_second_still_to_wait(
    project, enqueued, settings, monkeypatch
):
    triaged = []
    monkeypatch.setattr(calls, "after_traces_changed", triaged.append)
    settings.GATEWAY_QUIET_SECONDS = 60
    now = timezone.now()
    rows = record_model_calls([first_call(project, number) for number in range(4)])
    ids = [row.trace_id for row in rows]
    enqueued.clear()
    for trace_id, ago in zip(ids, (300, 30.5, 30.2, 10), strict=True):
        Trace.objects.filter(pk=trace_id).update(updated_at=now - timedelta(seconds=ago))

    assert tasks.settle_traces([*ids, 10**9]) == 2  # one settled, one gone

    assert triaged == [[ids[0]]]
    assert settle_tasks(enqueued) == [([ids[1], ids[2]], 30), ([ids[3]], 50)]


def test_calls_arriving_close_together_are_written_in_one_transaction(monkeypatch):
    monkeypatch.setattr(recorder_module, "BATCH_WAIT_SECONDS", 0.5)  # a loaded machine's sleeps
    batches = []
    monkeypatch.setattr(
        recorder_module, "record_model_calls", lambda batch, **kwargs: batches.append(len(batch))
    )
    recorder = CallRecorder()
    for number in range(5):
        recorder.submit(number)
        time.sleep(0.005)  # well inside the wait
    assert recorder.wait_until_idle(5)
    assert batches == [5]


def test_the_recorder_asks_once_for_the_traces_of_many_batches(monkeypatch):
    monkeypatch.setattr(recorder_module, "SETTLE_PUBLISH_SECONDS", 3.0)  # a loaded machine
    published = []
    # Other tests' recorder threads live on and may publish here too: this one's ids are its own.
    ours = iter(range(10**9, 10**9 + 3))
    monkeypatch.setattr(
        recorder_module,
        "settle_when_quiet",
        lambda trace_ids: published.append([i for i in trace_ids if i >= 10**9]),
    )

    def record(batch, *, ask_settle):
        ask_settle([next(ours)])  # as a committed batch does

    monkeypatch.setattr(recorder_module, "record_model_calls", record)
    recorder = CallRecorder()
    for _ in range(3):
        recorder.submit(object())
        assert recorder.wait_until_idle(5)  # three batches, one after the other
    assert not any(published)

    deadline = time.monotonic() + 10
    while not any(published) and time.monotonic() < deadline:  # no call comes: it asks anyway
        time.sleep(0.02)
    assert [ids for ids in published if ids] == [[10**9, 10**9 + 1, 10**9 + 2]]


def test_a_settle_the_broker_refused_is_asked_again(monkeypatch):
    published, attempts = [], []
    monkeypatch.setattr(recorder_module, "SETTLE_PUBLISH_SECONDS", 0.05)

    def publish(trace_ids):
        if 10**9 not in trace_ids:
            return  # another test's recorder thread
        attempts.append(trace_ids)
        if len(attempts) == 1:
            raise ConnectionError("broker away")
        published.append(trace_ids)

    monkeypatch.setattr(recorder_module, "settle_when_quiet", publish)
    monkeypatch.setattr(
        recorder_module, "record_model_calls", lambda batch, *, ask_settle: ask_settle([10**9])
    )
    recorder = CallRecorder()
    recorder.submit(object())
    deadline = time.monotonic() + 5
    while not published and time.monotonic() < deadline:
        time.sleep(0.02)
    assert attempts == [[10**9], [10**9]] and published == [[10**9]]


@pytest.mark.parametrize("remembered", [True, False], ids=["in memory", "by fingerprint"])
@pytest.mark.django_db
def test_a_long_history_re_sent_is_not_serialised_when_this_thread_recorded_it(
    project, enqueued, monkeypatch, remembered
):
    messages, _ = run_episode(project, 30, trace_id="long")
    if not remembered:  # another process recorded the episode so far
        monkeypatch.setattr(calls, "_sent_requests", calls._SentRequests())
    serialised = []
    original = calls._MessagesJson.__call__
    monkeypatch.setattr(
        calls._MessagesJson, "__call__", lambda self: serialised.append(1) or original(self)
    )
    following = [*messages, {"role": "user", "content": "And the docs."}]
    [row] = record_model_calls([call_of(project, following, answer(30), trace_id="long")])

    assert len(serialised) == (0 if remembered else 1)
    assert Trace.objects.get().body_json()["messages"] == [*following, answer(30)]
    assert row.request_prefix == len(following)

    # The fingerprint it left is the one the JSON has: another process checks the next call
    # by it and canonicalises only what is new.
    monkeypatch.setattr(calls, "_sent_requests", calls._SentRequests())
    canonicalised = []
    original_canonical = conversation.canonical_message
    monkeypatch.setattr(
        conversation,
        "canonical_message",
        lambda message: canonicalised.append(message) or original_canonical(message),
    )
    after = [*following, answer(30), {"role": "user", "content": "Thanks."}]
    [row] = record_model_calls([call_of(project, after, answer(31), trace_id="long")])
    assert len(canonicalised) <= 3
    assert row.request_prefix == len(after)
    assert Trace.objects.get().message_count == len(after) + 1


def test_the_requests_kept_in_memory_stay_under_their_limit(monkeypatch):
    monkeypatch.setattr(calls, "SENT_REQUESTS_BYTES", 1000)
    kept = calls._SentRequests()

    def sent(size: int):
        return calls._Sent([], calls._Fingerprint(1, size, None, ""), {})

    for number in range(5):
        kept.put((1, f"t{number}"), sent(300))
    kept.get((1, "t2"))  # used lately: kept
    kept.put((1, "t5"), sent(300))
    kept.put((1, "big"), sent(5000))  # larger than the limit: not kept at all

    assert list(kept.entries) == [(1, "t4"), (1, "t2"), (1, "t5")]
    assert kept.size == 900


def _fields(row) -> dict:
    """The row's values; a default time (timezone.now when built) as its type only."""
    values = {
        name: "a time" if name in {"received_at", "updated_at"} and value else value
        for name, value in vars(row).items()
        if name != "_state"
    }
    return {**values, "_cached": dict(row._state.fields_cache), "_adding": row._state.adding}


def test_new_row_builds_the_row_the_models_init_builds():
    """calls.new_row skips Model.__init__'s per-field work, not what it sets."""
    now = timezone.now()
    trace_values = dict(
        project_id=7, external_id="gw-1", source="gateway", started_at=now, body=b"",
        recording={"tools": [], "error_chars": 0},
    )  # fmt: skip
    assert _fields(calls.new_row(Trace, **trace_values)) == _fields(Trace(**trace_values))
    trace = Trace(**trace_values)
    for model, values in [
        (ModelCall, dict(project_id=7, requested_model="m", started_at=now, latency_ms=1.5)),
        (ModelCall, dict(project_id=7, trace=trace, response=None, status_code=None)),
        (TraceSegment, dict(trace=trace, messages=b"x")),
    ]:
        built, expected = calls.new_row(model, **values), model(**values)
        assert _fields(built) == _fields(expected)
        assert type(built) is model and built.pk is None
    # Each row gets its own mutable defaults, as with __init__.
    first, second = calls.new_row(Trace, project_id=1), calls.new_row(Trace, project_id=1)
    for name, value in vars(first).items():
        if isinstance(value, dict | list):
            assert value is not getattr(second, name)
