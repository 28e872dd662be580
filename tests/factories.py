"""Small builders for test data."""

import json

from django.test import Client


class ApiClient:
    """A Django test client that speaks JSON with a project key."""

    def __init__(self, key: str | None):
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def get(self, path: str, **params):
        return self.client.get(path, params, headers=self.headers)

    def post(self, path: str, payload=None, *, body: bytes | None = None, **extra):
        data = body if body is not None else json.dumps(payload)
        return self.client.post(
            path, data, content_type="application/json", headers=self.headers, **extra
        )

    def request(self, method: str, path: str, payload=None):
        """Any method; a GET sends no body."""
        if method == "GET":
            return self.get(path)
        return self.client.generic(
            method, path, json.dumps(payload), content_type="application/json", headers=self.headers
        )

    def patch(self, path: str, payload):
        return self.client.patch(
            path, json.dumps(payload), content_type="application/json", headers=self.headers
        )


def make_trace(external_id: str = "t-1", **overrides) -> dict:
    """A small agent trace with one tool call and its result."""
    trace = {
        "external_id": external_id,
        "model": "SmolLM2-135M-Instruct",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant with a calculator."},
            {"role": "user", "content": "What is 12 * 7?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"expression": "12*7"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "84"},
            {"role": "assistant", "content": "12 * 7 is 84."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "description": "Evaluate an arithmetic expression.",
                    "parameters": {
                        "type": "object",
                        "properties": {"expression": {"type": "string"}},
                        "required": ["expression"],
                    },
                },
            }
        ],
        "metadata": {"customer": "c-42"},
        "termination": "completed",
        "outcome": {"reward": 1.0, "success": True},
    }
    trace.update(overrides)
    return trace


# A one-turn conversation whose answer is wrong, for runs that are about their mechanics.
CAPITAL_CONVERSATION = [
    {"role": "user", "content": "what is the capital of france ?"},
    {"role": "assistant", "content": "rome"},
]


def approve_a_correction(project):
    """One trace with a wrong answer, feedback with a check on it, its correction approved."""
    from reviewapp.learning.models import DistillationTarget, TargetState
    from reviewapp.review.feedback import record_feedback
    from reviewapp.traces.ingest import ingest_traces

    ingest_traces(
        project=project, raw_items=[{"external_id": "t", "messages": CAPITAL_CONVERSATION}]
    )
    feedback, _ = record_feedback(
        trace=project.traces.get(),
        text="say paris",
        turn=1,
        checks=[{"kind": "regex", "value": "^paris"}],
    )
    return DistillationTarget.objects.create(
        feedback=feedback,
        turn=1,
        source="correction",
        student_context=CAPITAL_CONVERSATION[:1],
        target={"role": "assistant", "content": "paris"},
        state=TargetState.APPROVED,
    )


def feedback_with_proposals(project, external_id: str, replies: list, checks=None):
    """A feedback on turn 4 and its proposals, stored as the target task stores them; a
    reply is its text, or (text, passed when proposed)."""
    from reviewapp.learning.models import DistillationTarget
    from reviewapp.review.feedback import record_feedback
    from reviewapp.traces.ingest import ingest_traces

    ingest_traces(project=project, raw_items=[make_trace(external_id)])
    trace = project.traces.get(external_id=external_id)
    messages = trace.body_json()["messages"]
    feedback, _ = record_feedback(
        trace=trace, text="Begin with 'Answer:'.", turn=4, checks=checks or []
    )
    targets = []
    for reply in replies:
        text, passed = reply if isinstance(reply, tuple) else (reply, True)
        targets.append(
            DistillationTarget.objects.create(
                feedback=feedback,
                turn=4,
                source="hint",
                student_context=messages[:4],
                original=messages[4],
                target={"role": "assistant", "content": text},
                passes_checks=passed,
            )
        )
    return feedback, targets
