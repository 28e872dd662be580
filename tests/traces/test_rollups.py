"""The rollups equal a sum over every trace, after traces are written through the real paths
(the ingest API, the gateway's recorder, the outcome endpoint) and after those traces change."""

import math
import os
import subprocess
import sys
import textwrap
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from reviewapp.gateway.calls import RecordedCall, record_model_call
from reviewapp.monitors.monitors import Monitor, compute_monitor, monitor_of_traces
from reviewapp.review.models import Feedback
from reviewapp.traces import rollups
from reviewapp.traces.filters import filtered_traces
from reviewapp.traces.models import RolledUpTrace, ToolRollup, Trace, TraceRollup
from reviewapp.traces.rollups import SHARE_FIELDS, rebuild_rollups, roll_up_traces
from tests.factories import ApiClient, make_trace
from tests.site.scenarios import SHORT_ANSWER, play

REPO_ROOT = Path(__file__).resolve().parents[2]


def _figures(monitor: Monitor) -> list:
    """Everything a monitor shows, groups in order; the reward total rounded (float sums
    taken in another order differ in the last bits)."""

    def group(stats) -> tuple:
        tools = {
            name: (tool.calls, tool.errors, tool.error_examples)
            for name, tool in stats.tools.items()
        }
        fields = {**vars(stats), "tools": tools, "reward_total": round(stats.reward_total, 9)}
        return tuple(sorted(fields.items(), key=lambda item: item[0]))

    return [[group(g) for g in monitor.versions], [group(g) for g in monitor.series]]


def _assert_rollups_exact(project, **filters) -> None:
    for bucket in ("day", "hour"):
        from_rollups = compute_monitor(project=project, filters=filters, bucket=bucket)
        over_traces = monitor_of_traces(traces=filtered_traces(project, filters), bucket=bucket)
        assert from_rollups.versions, "nothing to compare"
        assert _figures(from_rollups) == _figures(over_traces)


def _rows() -> tuple[list, list]:
    trace_rows = sorted(
        tuple(row.values())
        for row in TraceRollup.objects.values(
            "project", "model", "adapter_version", "bucket", "termination", "traces",
            "first_seen", "succeeded", "unsuccessful", "tool_calls", "tokens_total",
            "tokens_reported", "rewarded", "tool_results", "tool_errors", "answers",
            "answer_words", "truncated_replies",
        )
    )  # fmt: skip
    tool_rows = sorted(
        tuple(row.values())
        for row in ToolRollup.objects.values(
            "project", "model", "adapter_version", "bucket", "termination", "tool", "results",
            "errors",
        )
    )  # fmt: skip
    return trace_rows, tool_rows


def _assert_same_as_rebuilt() -> None:
    kept = _rows()
    rebuild_rollups()
    assert kept == _rows()


def _call(project, *, trace_id: str, messages: list, answer: dict, termination="completed"):
    return RecordedCall(
        project_id=project.pk,
        trace_id_header=trace_id,
        requested_model="acme-agent",
        upstream_model="acme-v9",
        adapter_version="acme-v9",
        upstream_url="in-process",
        stream=False,
        request={"model": "acme-agent", "messages": messages},
        response={
            "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 7},
        },
        status_code=200,
        termination=termination,
        error="",
        started_at=datetime.now(UTC),
        latency_ms=1.0,
        time_to_first_token_ms=None,
    )


TOOL_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    ],
}


@pytest.fixture
def written(project, api_key):
    """Traces from the ingest API, the gateway's recorder (two harness versions, with tool
    failures) and the outcome endpoint."""
    api = ApiClient(api_key)
    pushed = [
        make_trace("p-1"),
        make_trace("p-2", termination="timeout", outcome={"success": False}),
        make_trace("p-3", termination="truncated", outcome=None, usage={"completion_tokens": 9}),
    ]
    assert api.post("/api/v1/traces", {"traces": pushed}).status_code == 207
    play(project=project, api_key=api_key, adapter_version="acme-v1", episodes=6, seed=1)
    play(
        project=project, api_key=api_key, adapter_version="acme-v2", answer=SHORT_ANSWER,
        episodes=6, tool_failure_rate=0.4, seed=2,
    )  # fmt: skip
    return api


def test_rollups_equal_the_sum_over_every_trace(project, written):
    _assert_rollups_exact(project)
    _assert_same_as_rebuilt()


def test_rollups_answer_the_version_termination_and_date_filters_exactly(project, written):
    _assert_rollups_exact(project, adapter="acme-v2")
    _assert_rollups_exact(project, model="SmolLM2-135M-Instruct", adapter="base")
    _assert_rollups_exact(project, termination=["completed", "timeout"])
    _assert_rollups_exact(project, since=date.today(), until=date.today())


def test_rollups_follow_an_outcome_that_changes_a_trace(project, written):
    response = written.post(
        "/api/v1/traces/p-1/outcome", {"termination": "tool_error", "success": False}
    )
    assert response.status_code == 200
    [group] = [
        g for g in compute_monitor(project=project).versions if g.version.model != "acme-agent"
    ]
    assert group.terminations == {"tool_error": 1, "timeout": 1, "truncated": 1}
    _assert_rollups_exact(project)
    _assert_same_as_rebuilt()


def test_rollups_follow_a_recorded_episode_whose_facts_and_termination_change(project, written):
    question = [{"role": "user", "content": "Where is my order?"}]
    record_model_call(_call(project, trace_id="ep-1", messages=question, answer=TOOL_CALL))
    before = compute_monitor(project=project)
    failed = [
        *question,
        TOOL_CALL,
        {"role": "tool", "tool_call_id": "c1", "content": "Error: down"},
    ]
    answer = {"role": "assistant", "content": "Sorry, the lookup is down."}
    record_model_call(
        _call(project, trace_id="ep-1", messages=failed, answer=answer, termination="timeout")
    )
    [group] = [g for g in compute_monitor(project=project).versions if g.version.label == "acme-v9"]
    assert (group.traces, group.terminations) == (1, {"timeout": 1})
    assert (group.tools["lookup"].calls, group.tools["lookup"].errors) == (1, 1)
    assert group.words_per_answer == 5.0
    assert [g.version.label for g in before.versions] == [
        g.version.label for g in compute_monitor(project=project).versions
    ]
    _assert_rollups_exact(project)
    _assert_same_as_rebuilt()


def test_a_trace_moved_out_of_its_rows_leaves_them_their_own_first_trace(project, written):
    first = Trace.objects.filter(adapter_version="acme-v1").order_by("received_at").first()
    Trace.objects.filter(pk=first.pk).update(adapter_version="acme-v0")
    roll_up_traces(trace_ids=[first.pk])
    _assert_rollups_exact(project)
    _assert_same_as_rebuilt()


def test_a_deleted_trace_is_taken_out(project, written):
    gone = Trace.objects.get(external_id="p-2")
    gone_id = gone.pk
    gone.delete()
    roll_up_traces(trace_ids=[gone_id])
    assert not RolledUpTrace.objects.filter(trace_id=gone_id).exists()
    assert not TraceRollup.objects.filter(termination="timeout", model=gone.model).exists()
    _assert_rollups_exact(project)
    _assert_same_as_rebuilt()


class _Undone(Exception):
    pass


def _changes_in_two_batches(project) -> None:
    """Writes that meet stored rollup rows: shares replaced (RolledUpTrace conflicts), sums
    added to and taken from existing rows, a tool emptied, a row's first trace moved out, a
    trace deleted, an earlier trace put in a row; then the same traces changed again."""
    p1, p2, p3 = (Trace.objects.get(external_id=name) for name in ("p-1", "p-2", "p-3"))
    with_tools = Trace.objects.filter(tool_error_count__gt=0).order_by("pk")
    failed, other = with_tools[0], with_tools[1]
    first = Trace.objects.filter(adapter_version="acme-v1").order_by("received_at").first()
    Trace.objects.filter(pk=p1.pk).update(success=False, reward=0.25, termination="tool_error")
    Trace.objects.filter(pk=failed.pk).update(tool_errors={}, tool_error_count=0)
    Trace.objects.filter(pk=first.pk).update(adapter_version="acme-v0")
    gone_id = p3.pk
    p3.delete()
    early = Trace.objects.create(
        project=project, external_id="early", source="api", body=b"", content_hash="x",
        received_at=p2.received_at - timedelta(seconds=1), termination=p2.termination,
        model=p2.model, adapter_version=p2.adapter_version, reward=1.5, completion_tokens=3,
        tool_results={"lookup": 2, "search": 1}, tool_errors={"lookup": 1},
        tool_result_count=3, tool_error_count=1, tool_call_count=3, answer_count=1,
        answer_words=4,
    )  # fmt: skip
    batch = [p1.pk, p2.pk, gone_id, failed.pk, other.pk, first.pk, early.pk]
    roll_up_traces(trace_ids=batch)
    Trace.objects.filter(pk=p1.pk).update(reward=None, success=True, completion_tokens=11)
    Trace.objects.filter(pk=early.pk).update(tool_results={"lookup": 1}, tool_result_count=1)
    roll_up_traces(trace_ids=batch)


def _stored_rollups() -> tuple:
    """Every rollup row, their reward totals (added in the same order by either path), and
    the RolledUpTrace rows by the trace's external id (a trace the test creates gets another
    id each time)."""
    external = dict(Trace.objects.values_list("pk", "external_id"))
    shares = sorted(
        (external[row.pop("trace_id")], tuple(row.items()))
        for row in RolledUpTrace.objects.values("trace_id", *SHARE_FIELDS)
    )
    rewards = sorted(
        TraceRollup.objects.values_list(
            "project", "model", "adapter_version", "bucket", "termination", "reward_total"
        )
    )
    return *_rows(), rewards, shares


def test_batches_meeting_stored_rollups_merge_as_the_orms_upserts_do(project, written, monkeypatch):
    """The same batches through PostgreSQL statements of our own (rows as JSON documents) and
    through the ORM's upserts (SQLite's path) leave the same rows, equal to a rebuild."""

    def roll_up(*, own_statements: bool) -> tuple:
        def not_this_path(*args, **kwargs):
            raise AssertionError("the other path")

        with monkeypatch.context() as patched:
            if own_statements:
                patched.setattr(rollups, "_upsert", not_this_path)
                patched.setattr(RolledUpTrace.objects, "bulk_create", not_this_path)
            else:
                patched.setattr(rollups, "_on_postgresql", lambda: False)
            try:
                with transaction.atomic():
                    _changes_in_two_batches(project)
                    _assert_rollups_exact(project)
                    stored = _stored_rollups()
                    _assert_same_as_rebuilt()
                    raise _Undone
            except _Undone:
                return stored

    assert connection.vendor == "postgresql"
    assert roll_up(own_statements=True) == roll_up(own_statements=False)


def test_a_reward_json_cannot_carry_goes_through_the_orm(project):
    trace = Trace.objects.create(
        project=project, external_id="nan", source="api", body=b"", content_hash="x",
        reward=float("nan"),
    )  # fmt: skip
    roll_up_traces(trace_ids=[trace.pk])
    assert math.isnan(RolledUpTrace.objects.get(trace_id=trace.pk).reward)
    assert math.isnan(TraceRollup.objects.get().reward_total)


def test_filters_the_rollups_cannot_answer_sum_over_the_traces(project, written):
    """Outcome and text are not in the rollups: the monitor reads the matching traces."""
    TraceRollup.objects.all().delete()  # were they read, the figures would be empty
    monitor = compute_monitor(project=project, filters={"outcome": "failure"})
    assert monitor.versions
    assert _figures(monitor) == _figures(
        monitor_of_traces(traces=filtered_traces(project, {"outcome": "failure"}))
    )


def test_rebuild_fills_the_rollups_of_traces_stored_before_them(project, written):
    kept = _rows()
    for model in (TraceRollup, ToolRollup, RolledUpTrace):
        model.objects.all().delete()
    assert compute_monitor(project=project).versions == []
    rebuild_rollups(project_ids=[project.pk])
    assert _rows() == kept
    _assert_rollups_exact(project)


def test_a_trace_received_late_in_the_day_is_in_that_day(project):
    late = datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)
    trace = Trace.objects.create(
        project=project, external_id="late", source="api", body=b"", content_hash="x",
        received_at=late, tool_results={"lookup": 2}, tool_result_count=2,
    )  # fmt: skip
    roll_up_traces(trace_ids=[trace.pk])
    [group] = compute_monitor(project=project, filters={"since": late.date()}).series
    assert group.bucket == datetime(2026, 3, 1, tzinfo=UTC)
    assert (
        compute_monitor(project=project, filters={"since": late.date() + timedelta(1)}).versions
        == []
    )
    _assert_rollups_exact(project, until=late.date())


def test_hours_and_days_in_a_time_zone_ahead_of_utc_equal_the_sum_over_every_trace(project):
    """A rollup's bucket is an hour of UTC, read as stored; in the current time zone (here one
    that leaves summer time, so an hour of the clock comes twice) the monitor's hours and days
    are still those of the traces, feedback included."""
    received = [
        datetime(2026, 10, 24, 21, 59, 59, tzinfo=UTC),  # 23:59:59 in Paris, summer time
        datetime(2026, 10, 24, 22, 0, tzinfo=UTC),  # midnight in Paris: the next day
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30, first time round
        datetime(2026, 10, 25, 1, 30, tzinfo=UTC),  # 02:30 again, winter time
        datetime(2026, 10, 25, 1, 45, tzinfo=UTC),
    ]
    traces = [
        Trace.objects.create(
            project=project, external_id=f"tz-{index}", source="api", body=b"",
            content_hash="x", received_at=at, termination="timeout" if index % 2 else "completed",
            adapter_version="acme-v1" if index < 2 else "acme-v2",
        )
        for index, at in enumerate(received)
    ]  # fmt: skip
    for trace in traces[1:4]:
        Feedback.objects.create(trace=trace, text="ok", content_hash=f"f-{trace.pk}")
    roll_up_traces(trace_ids=[trace.pk for trace in traces])
    with timezone.override("Europe/Paris"):
        _assert_rollups_exact(project)
        hourly = compute_monitor(project=project, bucket="hour")
    assert [(g.bucket.strftime("%d %H:%M"), g.traces, g.with_feedback) for g in hourly.series] == [
        ("24 23:00", 1, 0), ("25 00:00", 1, 1), ("25 02:00", 3, 2),
    ]  # fmt: skip


SQLITE_SCRIPT = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from reviewapp.traces.filters import filtered_traces
from reviewapp.traces.ingest import ingest_traces
from reviewapp.monitors.monitors import compute_monitor, monitor_of_traces
from reviewapp.projects.services import create_project
from reviewapp.traces.rollups import rebuild_rollups
from reviewapp.traces.models import TraceRollup, ToolRollup
from tests.factories import make_trace
project = create_project(slug="acme", name="Acme")
ingest_traces(project=project, raw_items=[
    make_trace("a"), make_trace("b", termination="timeout"),
    make_trace("c", messages=[{"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "Error: no such order"},
        {"role": "assistant", "content": "Sorry."}]),
])
rows = lambda: (sorted(TraceRollup.objects.values_list("termination", "traces", "tool_results")),
                sorted(ToolRollup.objects.values_list("tool", "results", "errors")))
kept = rows()
rebuild_rollups()
assert rows() == kept, (rows(), kept)
[group] = compute_monitor(project=project).versions
[direct] = monitor_of_traces(traces=filtered_traces(project, {})).versions
assert group == direct, (group, direct)
print("sqlite", group.traces, dict(group.tools["lookup"].__dict__))
"""


@pytest.mark.slow
def test_migration_and_rollups_on_sqlite(tmp_path):
    """The migration on an empty SQLite database, then the rollups there (JSON and upserts in
    SQLite's dialect) against the sum over the traces."""
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "reviewapp.settings",
    }
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SQLITE_SCRIPT)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sqlite 3 {'calls': 1, 'errors': 1" in result.stdout
