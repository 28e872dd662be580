"""The seed scenarios, played by the demo harness against a SCRIPTED in-process model.

`ScriptedGateway` stands where the gateway and vLLM stand in production: the harness's httpx
client talks to it through httpx.MockTransport. It answers tool steps with a call of the named
tool and answer steps with a reply whose length is the version's habit, and, like the gateway,
records every call after answering: the calls are folded into traces by the gateway's own
recording service (`record_model_call`) with the version's adapter name, and the harness's
outcome reports go to the real outcome endpoint, once the episodes are over.
"""

import json
from datetime import UTC, datetime

import httpx

from reviewapp.gateway.calls import RecordedCall, record_model_call
from reviewapp.harness.__main__ import parse_args, run_demo
from reviewapp.harness.agent import EpisodeResult
from reviewapp.projects.models import Project
from tests.factories import ApiClient

BASE_URL = "http://gateway.test/v1"
SERVED_MODEL = "acme-agent"
ARGUMENTS = {
    "calculator": '{"expression": "12 * 7"}',
    "lookup": '{"topic": "refunds"}',
    "clock": '{"timezone": "UTC"}',
}
LONG_ANSWER = "I checked with the tool, and here is what it says: {result}. Happy to help further."
SHORT_ANSWER = "{result}."


class ScriptedGateway:
    def __init__(self, *, project: Project, adapter_version: str, answer: str) -> None:
        self.project = project
        self.adapter_version = adapter_version
        self.answer = answer
        self.calls: list[RecordedCall] = []
        self.outcomes: list[tuple[str, dict]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/outcome"):
            self.outcomes.append((request.url.path, body))
            return httpx.Response(200, json={})
        response = {"choices": [{"index": 0, "message": self._reply(body)}]}
        response["choices"][0]["finish_reason"] = "stop"
        self.calls.append(
            RecordedCall(
                project_id=self.project.pk,
                trace_id_header=request.headers.get("X-Trace-Id", ""),
                requested_model=body["model"],
                upstream_model=self.adapter_version,
                adapter_version=self.adapter_version,
                upstream_url="in-process",
                stream=False,
                request=body,
                response=response,
                status_code=200,
                termination="completed",
                error="",
                started_at=datetime.now(UTC),
                latency_ms=1.0,
                time_to_first_token_ms=None,
            )
        )
        return httpx.Response(200, json=response)

    def _reply(self, body: dict) -> dict:
        choice = body["tool_choice"]
        if choice != "none":
            name = choice["function"]["name"]
            call_id = f"call-{len(self.calls)}"
            function = {"name": name, "arguments": ARGUMENTS[name]}
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        result = body["messages"][-1]["content"].rstrip(".")
        return {"role": "assistant", "content": self.answer.format(result=result)}

    def record(self, api_key: str) -> None:
        """What the gateway's recorder and the outcome endpoint do once the harness is answered."""
        for call in self.calls:
            record_model_call(call)
        api = ApiClient(api_key)
        for path, payload in self.outcomes:
            assert api.post(path, payload).status_code == 200


def play(
    *,
    project: Project,
    api_key: str,
    adapter_version: str,
    answer: str = LONG_ANSWER,
    episodes: int = 40,
    tool_failure_rate: float = 0.0,
    tool_latency: float = 0.0,
    slow_tool_rate: float = 1.0,
    time_budget: float = 5.0,
    seed: int = 0,
) -> list[EpisodeResult]:
    """Run the demo harness for one version and record its traces; returns the episodes."""
    args = parse_args(
        [
            f"--base-url={BASE_URL}",
            f"--api-key={api_key}",
            f"--model={SERVED_MODEL}",
            f"--episodes={episodes}",
            f"--tool-failure-rate={tool_failure_rate}",
            f"--tool-latency={tool_latency}",
            f"--slow-tool-rate={slow_tool_rate}",
            f"--time-budget={time_budget}",
            f"--seed={seed}",
            "--concurrency=1",
        ]
    )
    gateway = ScriptedGateway(project=project, adapter_version=adapter_version, answer=answer)
    with httpx.Client(transport=httpx.MockTransport(gateway.handle)) as client:
        results = run_demo(args, client)
    gateway.record(api_key)
    return results
