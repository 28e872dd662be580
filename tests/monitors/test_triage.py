"""Triage rules: which traces they route, sampling, idempotence, and the hooks after ingest."""

from datetime import timedelta

import pytest
from django.utils import timezone

from reviewapp import jobs
from reviewapp.gateway import tasks as gateway_tasks
from reviewapp.gateway.calls import RecordedCall, record_model_call
from reviewapp.monitors import tasks
from reviewapp.monitors.models import TriageMatch, TriageRule
from reviewapp.monitors.triage import in_sample, route_traces
from reviewapp.review.feedback import record_outcome
from reviewapp.review.models import Queue, QueueItem
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, Trace, TraceTag
from tests.factories import make_trace


def tool_trace(external_id: str, *, calls: int = 1, failing: str = "", **overrides) -> dict:
    """A trace with `calls` search calls; `failing`: that tool's result is an error."""
    messages = [{"role": "user", "content": "Find the opening hours of the museum."}]
    for index in range(calls):
        name = failing if failing and index == calls - 1 else "search"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{index}",
                        "type": "function",
                        "function": {"name": name, "arguments": "{}"},
                    }
                ],
            }
        )
        result = "Error: upstream unavailable" if failing and index == calls - 1 else "9am-5pm"
        messages.append({"role": "tool", "tool_call_id": f"c{index}", "content": result})
    messages.append({"role": "assistant", "content": "It opens at 9am."})
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in ("search", "calculator")
    ]
    return make_trace(external_id, messages=messages, tools=tools, **overrides)


def store(project, *items: dict) -> dict[str, Trace]:
    ingest_traces(project=project, raw_items=list(items))
    return {trace.external_id: trace for trace in project.traces.all()}


@pytest.fixture
def queue(project):
    return Queue.objects.create(project=project, name="timeouts")


def make_rule(project, queue, **conditions) -> TriageRule:
    return TriageRule.objects.create(project=project, name="rule", queue=queue, **conditions)


def run_triage(enqueued) -> None:
    """Run the triage jobs sent so far, as the worker would."""
    for args in enqueued.of(jobs.TRIAGE_TRACES):
        tasks.triage_traces(*args)


def queued(queue) -> set[str]:
    return set(QueueItem.objects.filter(queue=queue).values_list("trace__external_id", flat=True))


def test_rule_routes_only_traces_meeting_every_condition(project, queue):
    store(
        project,
        tool_trace("long-timeout", calls=3, termination="timeout"),
        tool_trace("short-timeout", calls=1, termination="timeout"),
        tool_trace("long-completed", calls=3, termination="completed"),
    )
    rule = make_rule(project, queue, termination="timeout", min_tool_calls=2)

    result = route_traces(rule=rule)

    assert (result.matched, result.routed) == (1, 1)
    assert queued(queue) == {"long-timeout"}


def test_failed_tool_condition_reads_the_tool_results(project, queue):
    store(
        project,
        tool_trace("search-failed", failing="search"),
        tool_trace("calculator-failed", failing="calculator"),
        tool_trace("fine"),
    )
    route_traces(rule=make_rule(project, queue, failed_tool="search"))
    assert queued(queue) == {"search-failed"}

    any_tool = Queue.objects.create(project=project, name="any tool")
    route_traces(rule=make_rule(project, any_tool, failed_tool="*"))
    assert queued(any_tool) == {"search-failed", "calculator-failed"}


def test_text_tag_model_and_outcome_conditions(project, queue):
    traces = store(
        project,
        make_trace("refund", messages=[{"role": "user", "content": "I want a REFUND now"}]),
        make_trace("other", outcome={"success": False}),
        make_trace("v2", model="shop-agent-v2"),
    )
    rude = Tag.objects.create(project=project, name="rude")
    TraceTag.objects.create(trace=traces["other"], tag=rude)
    cases = {
        "refund": {"text": "refund"},
        "other": {"tag": rude},
        "v2": {"model": "shop-agent-v2"},
    }
    for external_id, condition in cases.items():
        target = Queue.objects.create(project=project, name=external_id)
        route_traces(rule=make_rule(project, target, **condition))
        assert queued(target) == {external_id}
    failures = Queue.objects.create(project=project, name="failures")
    route_traces(rule=make_rule(project, failures, outcome="failure"))
    assert queued(failures) == {"other"}


def test_sampling_is_deterministic_and_close_to_the_rate(project, queue):
    store(project, *(make_trace(f"t-{i}", termination="timeout") for i in range(200)))
    rule = make_rule(project, queue, termination="timeout", sample_rate=0.25)

    first = route_traces(rule=rule)
    routed = queued(queue)

    assert first.matched == 200
    assert 30 <= first.routed <= 70
    expected = {
        trace.external_id
        for trace in project.traces.all()
        if in_sample(rule_id=rule.pk, trace_id=trace.pk, rate=0.25)
    }
    assert routed == expected
    # Forget what the rule saw: the same traces are picked again, and none is queued twice.
    TriageMatch.objects.filter(rule=rule).delete()
    again = route_traces(rule=rule)
    assert again.routed == first.routed
    assert QueueItem.objects.filter(queue=queue).count() == first.routed


def test_running_a_rule_again_adds_nothing(project, queue):
    store(project, make_trace("a", termination="timeout"), make_trace("b", termination="timeout"))
    rule = make_rule(project, queue, termination="timeout")
    route_traces(rule=rule)

    again = route_traces(rule=rule)

    assert (again.matched, again.routed) == (0, 0)
    assert QueueItem.objects.filter(queue=queue).count() == 2
    positions = QueueItem.objects.filter(queue=queue).order_by("position")
    assert list(positions.values_list("position", flat=True)) == [1, 2]


def test_a_trace_is_never_queued_twice_by_two_rules(project, queue):
    store(project, tool_trace("both", calls=3, termination="timeout"))
    route_traces(rule=make_rule(project, queue, termination="timeout"))
    route_traces(rule=make_rule(project, queue, min_tool_calls=1))

    assert QueueItem.objects.filter(queue=queue).count() == 1
    assert TriageMatch.objects.count() == 2  # each rule still counts its match


def test_new_traces_are_triaged_once_ingest_commits(
    project, queue, api, enqueued, django_capture_on_commit_callbacks
):
    make_rule(project, queue, termination="timeout")
    make_rule(project, Queue.objects.create(project=project, name="off"), enabled=False, text="a")

    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            "/api/v1/traces",
            {"traces": [make_trace("late", termination="timeout"), make_trace("fine")]},
        )
    run_triage(enqueued)

    assert response.status_code == 207
    assert queued(queue) == {"late"}
    assert QueueItem.objects.exclude(queue=queue).count() == 0  # the disabled rule did nothing
    [(embedded,)] = enqueued.of(jobs.EMBED_TRACES)
    assert sorted(embedded) == sorted(project.traces.values_list("id", flat=True))


def test_a_reported_outcome_is_triaged(
    project, queue, enqueued, django_capture_on_commit_callbacks
):
    trace = store(project, make_trace("t", outcome=None))["t"]
    make_rule(project, queue, outcome="failure")

    with django_capture_on_commit_callbacks(execute=True):
        record_outcome(trace=trace, success=False)
    run_triage(enqueued)

    assert queued(queue) == {"t"}


def test_run_now_task_skips_a_disabled_rule(project, queue):
    store(project, make_trace("a", termination="timeout"))
    rule = make_rule(project, queue, termination="timeout", enabled=False)

    assert tasks.run_triage_rule(rule.pk) == 0
    rule.enabled = True
    rule.save()
    assert tasks.run_triage_rule(rule.pk) == 1


def test_a_recorded_gateway_call_is_triaged_and_embedded_once_it_goes_quiet(
    project, queue, enqueued, settings, django_capture_on_commit_callbacks
):
    make_rule(project, queue, termination="timeout")
    call = RecordedCall(
        project_id=project.pk,
        trace_id_header="episode-1",
        requested_model="m",
        upstream_model="m",
        adapter_version="",
        upstream_url="http://127.0.0.1:9/v1",
        stream=False,
        request={"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
        response=None,
        status_code=None,
        termination="timeout",
        error="upstream too slow",
        started_at=timezone.now() - timedelta(minutes=1),
        latency_ms=30000.0,
        time_to_first_token_ms=None,
    )

    with django_capture_on_commit_callbacks(execute=True):
        record_model_call(call)
    run_triage(enqueued)
    trace = Trace.objects.get(external_id="episode-1")
    assert enqueued.of(jobs.SETTLE_TRACES) == [([trace.pk],)] and queued(queue) == set()
    assert enqueued.of(jobs.EMBED_TRACES) == []

    settings.GATEWAY_QUIET_SECONDS = 0
    with django_capture_on_commit_callbacks(execute=True):
        assert gateway_tasks.settle_trace(trace.pk) is True
    run_triage(enqueued)
    assert queued(queue) == {"episode-1"}
    assert enqueued.of(jobs.EMBED_TRACES) == [([trace.pk],)]
