"""A Retrain renders each turn with the tools its prompt showed when it was served: the demo
agent's answer step (tool_choice "none") is trained, taught and judged without the definitions
vLLM left out of it, its tool call step with them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from reviewapp.gateway.calls import RecordedCall, record_model_call
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.retrain import _training_job
from reviewapp.learning.runs import start_retrain
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.models import Trace

LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
QUESTION = {"role": "user", "content": "How many vacation days?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "lookup", "arguments": '{"topic": "vacation"}'}}],
}  # fmt: skip
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "25 days a year."}
ANSWER = {"role": "assistant", "content": "25 days."}


def _call(project, messages: list[dict], reply: dict, **request) -> RecordedCall:
    return RecordedCall(
        project_id=project.pk,
        trace_id_header="episode",
        requested_model="agent",
        upstream_model="agent",
        adapter_version="",
        upstream_url="http://127.0.0.1:9/v1",
        stream=False,
        request={"model": "agent", "messages": messages, "tools": [LOOKUP], **request},
        response={"choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]},
        status_code=200,
        termination="completed",
        error="",
        started_at=timezone.now() - timedelta(milliseconds=5),
        latency_ms=5.0,
        time_to_first_token_ms=None,
    )


def _approve(trace: Trace, turn: int, target: dict) -> None:
    messages = trace.body_json()["messages"]
    feedback, _ = record_feedback(trace=trace, text=f"fix turn {turn}", turn=turn)
    DistillationTarget.objects.create(
        feedback=feedback,
        turn=turn,
        source="correction",
        student_context=messages[:turn],
        target=target,
        state=TargetState.APPROVED,
    )


@pytest.mark.django_db
def test_each_trained_and_judged_turn_has_the_tools_it_was_served_with(project):
    record_model_call(_call(project, [QUESTION], CALL, tool_choice="required"))
    record_model_call(_call(project, [QUESTION, CALL, RESULT], ANSWER, tool_choice="none"))
    trace = Trace.objects.get()
    _approve(trace, 1, CALL)
    _approve(trace, 3, {"role": "assistant", "content": "Answer: 25 days."})
    run = start_retrain(project=project)

    job = _training_job(run)

    tools_by_turn = {len(example.context): example.tools for example in job.examples}
    assert tools_by_turn == {1: [LOOKUP], 3: None}
    judged = {len(item["context"]): item["tools"] for item in job.feedback_items}
    assert judged == {1: [LOOKUP], 3: None}
