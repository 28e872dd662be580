"""Pothole alerts on the two seed scenarios, played by the demo harness, and on healthy versions."""

import re

import pytest

from reviewapp.learning.dataset import DataPolicy, set_data_policy
from reviewapp.monitors.alerts import project_alerts
from reviewapp.traces.filters import filtered_traces
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace
from tests.site.scenarios import SHORT_ANSWER, play


def _kinds(alerts) -> list[tuple[str, str]]:
    return sorted((alert.kind, alert.version) for alert in alerts)


def _percents(message: str) -> list[int]:
    return [int(number) for number in re.findall(r"(\d+)%", message)]


@pytest.fixture
def healthy_v1(project, api_key):
    return play(project=project, api_key=api_key, adapter_version="acme-v1", seed=1)


def test_tool_failures_with_shrinking_answers_raise_an_alert_with_numbers(
    project, api_key, healthy_v1
):
    v2 = play(
        project=project, api_key=api_key, adapter_version="acme-v2", answer=SHORT_ANSWER,
        tool_failure_rate=0.2, seed=2,
    )  # fmt: skip
    alerts = project_alerts(project=project)
    [shrinking] = [alert for alert in alerts if alert.kind == "shrinking_under_tool_errors"]
    assert (shrinking.version, shrinking.previous_version) == ("acme-v2", "acme-v1")
    assert shrinking.severity == "critical"
    calls = sum(result.tool_calls for result in v2)
    failures = sum(result.tool_failures for result in v2)
    shorter, error_rate, before = _percents(shrinking.message)
    assert shorter >= 50  # 15 words per answer fell to 2
    assert error_rate == round(100 * failures / calls) and 10 <= error_rate <= 30
    assert before == 0
    assert f"{calls} tool results in 40 traces" in shrinking.message
    urls = [item.url for item in shrinking.evidence]
    assert "/p/acme/traces/?adapter=acme-v2&model=acme-agent" in urls
    assert "/p/acme/traces/?adapter=acme-v2&model=acme-agent&termination=tool_error" in urls
    assert any(re.fullmatch(r"/p/acme/traces/\d+/", url) for url in urls)  # a failing trace
    # Each tool that started failing is named on its own.
    jumps = [alert for alert in alerts if alert.kind == "tool_failure_jump"]
    assert jumps and all("up from 0%" in alert.message for alert in jumps)


def test_slow_tools_under_a_time_budget_raise_a_timeout_alert(project, api_key, healthy_v1):
    slow = play(
        project=project, api_key=api_key, adapter_version="acme-v2", episodes=30,
        tool_latency=1.0, slow_tool_rate=0.3, time_budget=0.05, seed=4,
    )  # fmt: skip
    timeouts = sum(result.termination == "timeout" for result in slow)
    alerts = project_alerts(project=project)
    assert _kinds(alerts) == [("timeouts_rising", "acme-v2")]
    [alert] = alerts
    assert f"({timeouts} of 30)" in alert.message
    assert _percents(alert.message) == [round(100 * timeouts / 30), 0]
    assert alert.evidence[0].url == (
        "/p/acme/traces/?adapter=acme-v2&model=acme-agent&termination=timeout"
    )


def test_excluding_timeouts_from_training_adds_an_exclusion_alert(project, api_key, healthy_v1):
    set_data_policy(project=project, policy=DataPolicy(timeout="exclude"))
    play(
        project=project, api_key=api_key, adapter_version="acme-v2", episodes=30,
        tool_latency=1.0, slow_tool_rate=0.3, time_budget=0.05, seed=4,
    )  # fmt: skip
    project.refresh_from_db()
    kinds = _kinds(project_alerts(project=project))
    assert kinds == [("exclusions_rising", "acme-v2"), ("timeouts_rising", "acme-v2")]


def test_healthy_versions_raise_no_alert(project, api_key, healthy_v1):
    play(project=project, api_key=api_key, adapter_version="acme-v2", seed=7)
    assert project_alerts(project=project) == []


def test_tool_failures_alone_with_unchanged_answers_raise_only_the_tool_jump(
    project, api_key, healthy_v1
):
    play(project=project, api_key=api_key, adapter_version="acme-v2", tool_failure_rate=0.3, seed=8)
    kinds = {kind for kind, _ in _kinds(project_alerts(project=project))}
    assert kinds == {"tool_failure_jump"}


def test_a_version_with_too_few_traces_is_not_compared(project, api_key, healthy_v1):
    play(
        project=project, api_key=api_key, adapter_version="acme-v2", episodes=5,
        answer=SHORT_ANSWER, tool_failure_rate=0.5, seed=9,
    )  # fmt: skip
    assert project_alerts(project=project) == []


def _lookup(call_id: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function",
                        "function": {"name": "lookup", "arguments": '{"topic": "refunds"}'}}],
    }  # fmt: skip


def _episode(external_id: str, model: str, *, tries_again: bool) -> dict:
    """The first lookup fails; the agent calls again and answers with the result, or answers
    straight away."""
    failed = [_lookup("a"), {"role": "tool", "tool_call_id": "a", "content": "Error: timed out"}]
    retried = [_lookup("b"), {"role": "tool", "tool_call_id": "b", "content": "Within 30 days."}]
    messages = [
        {"role": "user", "content": "How long do refunds take?"},
        *failed,
        *(retried if tries_again else []),
        {"role": "assistant", "content": "Refunds are issued within 30 days."},
    ]
    return make_trace(external_id, model=model, messages=messages)


def test_an_agent_answering_failed_calls_at_once_instead_of_trying_again_raises_an_alert(
    project,
):
    # The same failures in both versions (one per trace): only what the agent does next changed.
    ingest_traces(
        project=project,
        raw_items=[_episode(f"a-{i}", "agent-a", tries_again=True) for i in range(20)],
    )
    ingest_traces(
        project=project,
        raw_items=[_episode(f"b-{i}", "agent-b", tries_again=i < 12) for i in range(20)],
    )

    # (Fewer calls per trace also raise the shrinking and the per-tool alerts.)
    [alert] = [a for a in project_alerts(project=project) if a.kind == "answering_on_failed_tools"]

    assert (alert.kind, alert.version, alert.previous_version) == (
        "answering_on_failed_tools", "agent-b (base)", "agent-a (base)",
    )  # fmt: skip
    assert "straight after 40% of its failed tool calls (8 of 20)" in alert.message
    assert "up from 0% in agent-a (base)" in alert.message
    link = alert.evidence[0].url
    assert link == "/p/acme/traces/?adapter=base&model=agent-b&tool_failure=answered"
    # The link's filter lists exactly the traces behind the number.
    answered = filtered_traces(project, {"tool_failure": "answered", "model": "agent-b"})
    assert sorted(answered.values_list("external_id", flat=True)) == sorted(
        f"b-{i}" for i in range(12, 20)
    )


def test_an_agent_that_never_met_a_failure_is_not_compared_on_answering_them(project):
    ingest_traces(
        project=project, raw_items=[make_trace(f"a-{i}", model="agent-a") for i in range(20)]
    )
    ingest_traces(
        project=project,
        raw_items=[_episode(f"b-{i}", "agent-b", tries_again=False) for i in range(20)],
    )

    kinds = {alert.kind for alert in project_alerts(project=project)}

    assert "answering_on_failed_tools" not in kinds
