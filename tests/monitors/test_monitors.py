"""Monitors over traces the demo harness made (scripted model, real recording), and by hand."""

import statistics

import pytest

from reviewapp.monitors import monitors
from reviewapp.monitors.monitors import (
    Version,
    compute_monitor,
    evidence_url,
    monitor_of_traces,
)
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace
from tests.factories import make_trace
from tests.site.scenarios import SHORT_ANSWER, play


def _by_label(monitor) -> dict:
    return {group.version.label: group for group in monitor.versions}


def _words(results) -> float:
    return statistics.fmean(len(result.answer.split()) for result in results if result.answer)


@pytest.fixture
def tool_failure_scenario(project, api_key):
    """v1 meets reliable tools; v2 meets tools failing 20% of the time, and answers tersely."""
    v1 = play(project=project, api_key=api_key, adapter_version="acme-v1", seed=1)
    v2 = play(
        project=project, api_key=api_key, adapter_version="acme-v2", answer=SHORT_ANSWER,
        tool_failure_rate=0.2, seed=2,
    )  # fmt: skip
    return v1, v2


def test_tool_error_rate_and_answer_length_per_version_match_the_harness(
    project, tool_failure_scenario
):
    v1, v2 = tool_failure_scenario
    monitor = compute_monitor(project=project)
    assert [group.version.label for group in monitor.versions] == ["acme-v1", "acme-v2"]
    old, new = _by_label(monitor)["acme-v1"], _by_label(monitor)["acme-v2"]
    assert (old.traces, new.traces) == (40, 40)
    assert old.tool_error_rate == 0.0
    v2_calls = sum(result.tool_calls for result in v2)
    v2_failures = sum(result.tool_failures for result in v2)
    assert (new.tool_results, new.tool_errors) == (v2_calls, v2_failures)
    assert 0.1 <= new.tool_error_rate <= 0.3
    assert old.words_per_answer == pytest.approx(_words(v1))
    assert new.words_per_answer == pytest.approx(_words(v2))
    assert new.words_per_answer < 0.5 * old.words_per_answer
    # Failed tools are retried, so v2 calls tools more often per episode.
    assert new.tool_calls_per_trace == pytest.approx(v2_calls / 40)
    terminations = {
        name: sum(result.termination == name for result in v2) for name in ("tool_error",)
    }
    assert new.terminations.get("tool_error", 0) == terminations["tool_error"] > 0
    assert new.error_examples  # trace ids to open


def test_timeout_rate_per_version_matches_the_harness(project, api_key):
    play(project=project, api_key=api_key, adapter_version="acme-v1", seed=3)
    slow = play(
        project=project, api_key=api_key, adapter_version="acme-v2", episodes=30,
        tool_latency=1.0, slow_tool_rate=0.3, time_budget=0.05, seed=4,
    )  # fmt: skip
    monitor = compute_monitor(project=project)
    old, new = _by_label(monitor)["acme-v1"], _by_label(monitor)["acme-v2"]
    timeouts = sum(result.termination == "timeout" for result in slow)
    assert old.timeout_rate == 0.0
    assert new.timeout_rate == pytest.approx(timeouts / 30)
    assert 0.1 <= new.timeout_rate <= 0.5
    # A timed-out episode is a failure even though nobody said so.
    assert new.failed >= timeouts


def test_each_bucket_holds_its_versions_traces(project, api_key):
    play(project=project, api_key=api_key, adapter_version="acme-v1", episodes=6, seed=5)
    monitor = compute_monitor(project=project, bucket="hour")
    [group] = monitor.series
    assert (group.version.label, group.traces) == ("acme-v1", 6)
    assert group.tool_results == sum(trace.tool_result_count for trace in Trace.objects.all())
    assert len(monitor.buckets) == 1


def test_feedback_rate_success_and_reward_come_from_the_columns(project):
    ingest_traces(
        project=project,
        raw_items=[
            make_trace("a", outcome={"reward": 1.0, "success": True}),
            make_trace("b", outcome={"reward": 0.0, "success": False}),
            make_trace("c", termination="timeout", outcome=None),
            make_trace("d", outcome=None),
        ],
    )
    record_feedback(trace=project.traces.get(external_id="b"), text="Wrong.", turn=4)
    [group] = compute_monitor(project=project).versions
    assert group.version == Version("SmolLM2-135M-Instruct", "")
    assert group.feedback_rate == 0.25
    assert (group.succeeded, group.failed) == (1, 2)  # the timeout counts as a failure
    assert group.reward == 0.5
    assert group.tool_calls_per_trace == 1.0


def _bulk_traces(project, count: int, *, adapter_version: str, failing_every: int) -> None:
    """`count` traces straight into the table, facts set as ingest would: one lookup result
    each, every `failing_every`-th failed, one 3-word answer each."""
    Trace.objects.bulk_create(
        [
            Trace(
                project=project, external_id=f"{adapter_version}-{i}", source="api",
                model="m", adapter_version=adapter_version, body=b"", content_hash="x",
                tool_results={"lookup": 1, "ship": 1},
                tool_errors={"lookup": 1} if i % failing_every == 0 else {},
                tool_result_count=2, tool_error_count=int(i % failing_every == 0),
                answer_count=1, answer_words=3,
            )
            for i in range(count)
        ],
        batch_size=1000,
    )  # fmt: skip


def test_tool_figures_are_exact_over_more_traces_than_a_sample_would_read(project):
    _bulk_traces(project, 2100, adapter_version="acme-v1", failing_every=7)
    _bulk_traces(project, 2300, adapter_version="acme-v2", failing_every=2)
    monitor = monitor_of_traces(traces=Trace.objects.filter(project=project))
    old, new = _by_label(monitor)["acme-v1"], _by_label(monitor)["acme-v2"]
    assert (old.tools["lookup"].calls, old.tools["lookup"].errors) == (2100, 300)
    assert (new.tools["lookup"].calls, new.tools["lookup"].errors) == (2300, 1150)
    assert (new.tools["ship"].calls, new.tools["ship"].errors) == (2300, 0)
    assert (new.tool_results, new.tool_errors) == (4600, 1150)
    assert new.words_per_answer == 3.0
    newest_failing = list(
        Trace.objects.filter(adapter_version="acme-v2", tool_error_count__gt=0)
        .order_by("-id")
        .values_list("id", flat=True)[:5]
    )
    assert new.tools["lookup"].error_examples == sorted(newest_failing)
    assert new.error_examples == sorted(newest_failing)


def test_tool_figures_follow_the_filters(project):
    _bulk_traces(project, 30, adapter_version="acme-v1", failing_every=3)
    traces = Trace.objects.filter(project=project, external_id__endswith="0")
    [group] = monitor_of_traces(traces=traces).versions
    assert (group.traces, group.tools["lookup"].calls, group.tools["lookup"].errors) == (3, 3, 1)


def test_evidence_url_keeps_the_page_filters_and_selects_the_version(project):
    url = evidence_url(
        project, {"since": "2026-01-01"}, **Version("m", "").trace_filters(), termination="timeout"
    )
    assert url == "/p/acme/traces/?since=2026-01-01&adapter=base&model=m&termination=timeout"


def test_a_tool_only_old_traces_called_is_still_counted(project, monkeypatch):
    """Tools are summed by name when the newest traces or the failures name them all; a tool
    neither names is found by recounting every JSON key, so the figures stay exact."""
    monkeypatch.setattr(monitors, "NEWEST_TRACES_FOR_NAMES", 1)
    _bulk_traces(project, 10, adapter_version="acme-v1", failing_every=3)
    Trace.objects.filter(external_id="acme-v1-1").update(
        tool_results={"archive": 4}, tool_result_count=4
    )
    [group] = monitor_of_traces(traces=Trace.objects.filter(project=project)).versions
    assert group.tools["archive"].calls == 4
    assert (group.tools["lookup"].calls, group.tools["lookup"].errors) == (9, 4)
    assert group.tools["ship"].calls == 9


def test_a_tool_that_failed_long_ago_still_links_its_failing_trace(project, monkeypatch):
    monkeypatch.setattr(monitors, "FAILING_CHUNK", 2)
    _bulk_traces(project, 12, adapter_version="acme-v1", failing_every=1)
    old = Trace.objects.get(external_id="acme-v1-0")
    Trace.objects.filter(pk=old.pk).update(tool_errors={"lookup": 1, "ship": 1}, tool_error_count=2)
    [group] = monitor_of_traces(traces=Trace.objects.filter(project=project)).versions
    assert group.tools["ship"].error_examples == [old.pk]
    assert group.tools["lookup"].error_examples == sorted(
        Trace.objects.order_by("-id").values_list("id", flat=True)[:5]
    )
