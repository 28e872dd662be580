"""Monitors over traces the demo harness made (scripted model, real recording), and by hand."""

import statistics

import pytest

from reviewapp.models import Trace
from reviewapp.services import monitors
from reviewapp.services.feedback import record_feedback
from reviewapp.services.ingest import ingest_traces
from reviewapp.services.monitors import Version, compute_monitor, evidence_url
from tests.factories import make_trace
from tests.reviewapp.scenarios import SHORT_ANSWER, play


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
    monitor = compute_monitor(traces=Trace.objects.filter(project=project))
    assert [group.version.label for group in monitor.versions] == ["acme-v1", "acme-v2"]
    old, new = _by_label(monitor)["acme-v1"], _by_label(monitor)["acme-v2"]
    assert (old.traces, new.traces) == (40, 40)
    assert old.body.tool_error_rate == 0.0
    v2_calls = sum(result.tool_calls for result in v2)
    v2_failures = sum(result.tool_failures for result in v2)
    assert (new.body.tool_results, new.body.tool_errors) == (v2_calls, v2_failures)
    assert 0.1 <= new.body.tool_error_rate <= 0.3
    assert old.body.words_per_answer == pytest.approx(_words(v1))
    assert new.body.words_per_answer == pytest.approx(_words(v2))
    assert new.body.words_per_answer < 0.5 * old.body.words_per_answer
    # Failed tools are retried, so v2 calls tools more often per episode.
    assert new.tool_calls_per_trace == pytest.approx(v2_calls / 40)
    terminations = {
        name: sum(result.termination == name for result in v2) for name in ("tool_error",)
    }
    assert new.terminations.get("tool_error", 0) == terminations["tool_error"] > 0
    assert new.body.error_examples  # trace ids to open


def test_timeout_rate_per_version_matches_the_harness(project, api_key):
    play(project=project, api_key=api_key, adapter_version="acme-v1", seed=3)
    slow = play(
        project=project, api_key=api_key, adapter_version="acme-v2", episodes=30,
        tool_latency=1.0, slow_tool_rate=0.3, time_budget=0.05, seed=4,
    )  # fmt: skip
    monitor = compute_monitor(traces=Trace.objects.filter(project=project))
    old, new = _by_label(monitor)["acme-v1"], _by_label(monitor)["acme-v2"]
    timeouts = sum(result.termination == "timeout" for result in slow)
    assert old.timeout_rate == 0.0
    assert new.timeout_rate == pytest.approx(timeouts / 30)
    assert 0.1 <= new.timeout_rate <= 0.5
    # A timed-out episode is a failure even though nobody said so.
    assert new.failed >= timeouts


def test_each_bucket_holds_its_versions_traces(project, api_key):
    play(project=project, api_key=api_key, adapter_version="acme-v1", episodes=6, seed=5)
    monitor = compute_monitor(traces=Trace.objects.filter(project=project), bucket="hour")
    [group] = monitor.series
    assert (group.version.label, group.traces, group.body.traces) == ("acme-v1", 6, 6)
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
    [group] = compute_monitor(traces=Trace.objects.filter(project=project)).versions
    assert group.version == Version("SmolLM2-135M-Instruct", "")
    assert group.feedback_rate == 0.25
    assert (group.succeeded, group.failed) == (1, 2)  # the timeout counts as a failure
    assert group.reward == 0.5
    assert group.tool_calls_per_trace == 1.0


def test_bodies_read_are_bounded_whatever_the_size(project, monkeypatch):
    monkeypatch.setattr(monitors, "BODY_BUDGET", 10)
    ingest_traces(project=project, raw_items=[make_trace(f"t-{i}") for i in range(30)])
    monitor = compute_monitor(traces=Trace.objects.filter(project=project))
    [group] = monitor.versions
    assert group.traces == 30
    assert monitor.bodies_read == group.body.traces == 10


def test_evidence_url_keeps_the_page_filters_and_selects_the_version(project):
    url = evidence_url(
        project, {"since": "2026-01-01"}, **Version("m", "").trace_filters(), termination="timeout"
    )
    assert url == "/p/acme/traces/?since=2026-01-01&adapter=base&model=m&termination=timeout"
