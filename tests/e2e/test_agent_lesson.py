"""One agent lesson through the whole loop, real parts only (PostgreSQL, Redis, a Celery worker,
vLLM CPU with the bundled model, the web process): "use the calculator for arithmetic instead of
answering from memory".

The demo agent offers its tools with tool_choice "auto" through the gateway; the bundled model
answers arithmetic from memory. Reviewers pin feedback with action checks to those answers and
correct each into the calculator call; Retrain; the gate passes and the adapter deploys; a new
question, never reviewed, now makes the agent call the calculator in a live episode.
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from reviewapp.harness.agent import EpisodeResult, run_episode
from reviewapp.harness.tasks import TASKS, Task
from reviewapp.harness.tools import ToolEnvironment
from reviewapp.learning.models import Adapter
from reviewapp.projects.services import create_api_key
from reviewapp.review.models import Feedback, FeedbackStatus
from tests.e2e.test_full_loop import (
    MODEL,
    _adapter_versions,
    _recorded_whole,
    _wait_for,
    web_and_worker,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

__all__ = ["web_and_worker"]  # the fixture, used by name

FEEDBACK = "Use the calculator tool for arithmetic instead of answering from memory."
CHECKS = [
    {"kind": "calls_tool", "value": "calculator"},
    {"kind": "tool_argument", "value": {"tool": "calculator", "argument": "expression",
                                        "pattern": r"\d"}},
]  # fmt: skip
# The reviewed questions and the call a reviewer writes for each.
TAUGHT = {"calc-multiply": "12 * 7", "calc-add": "347 + 589", "calc-subtract": "1000 - 273"}
TASKS_BY_ID = {task.task_id: task for task in TASKS}
NEW_TASKS = [TASKS_BY_ID["calc-divide"], TASKS_BY_ID["calc-parentheses"]]  # never reviewed
RUN_TIMEOUT_S = 1200


def _episode(client: httpx.Client, gateway: str, key: str, task: Task, trace_id: str):
    return run_episode(
        client,
        base_url=gateway,
        api_key=key,
        model=MODEL,
        task=task,
        env=ToolEnvironment(failure_rate=0.0, seed=0),
        time_budget_s=180,
        max_steps=3,
        trace_id=trace_id,
        tool_choice="auto",
    )


def _episodes(client: httpx.Client, gateway: str, key: str, asked: list[tuple[Task, str]]):
    """Each (task, label) as an episode with trace id <label>-<task id>, all in flight together:
    vLLM batches their turns, as it does a harness's workers'."""

    def episode(task_and_label: tuple[Task, str]) -> EpisodeResult:
        task, label = task_and_label
        return _episode(client, gateway, key, task, f"{label}-{task.task_id}")

    with ThreadPoolExecutor(max_workers=len(asked)) as pool:
        return list(pool.map(episode, asked))


def _calculator_calls(result: EpisodeResult) -> list[dict]:
    return [
        call["function"]
        for message in result.messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or ()
        if call["function"]["name"] == "calculator"
    ]


def test_corrected_tool_calls_teach_the_agent_to_call_the_calculator_on_a_new_question(
    web_and_worker, vllm_url, project
):
    # Adapters are named <slug>-v<N>, and the session's vLLM keeps every adapter earlier tests
    # loaded: under the fixture's "acme" this run's acme-v1 would be taken as loaded already
    # and an earlier test's acme-v1 would answer.
    project.slug = "agent-lesson"
    project.upstream_url = vllm_url
    project.served_model = MODEL
    project.settings = {}  # default training and gate settings: 3 corrections as they come
    project.save()
    key = create_api_key(project=project, scopes=["ingest", "review", "admin"])[1]
    gateway = web_and_worker
    client = httpx.Client()
    api = httpx.Client(
        base_url=gateway.removesuffix("/v1"), headers={"Authorization": f"Bearer {key}"}, timeout=60
    )

    # 1. The base model, tools offered, answers arithmetic from memory: the reviewed questions
    # and the new ones alike.
    asked = [(TASKS_BY_ID[task_id], "before") for task_id in TAUGHT]
    asked += [(task, "base") for task in NEW_TASKS]
    answered = _episodes(client, gateway, key, asked)
    before = dict(zip(TAUGHT, answered[: len(TAUGHT)], strict=True))
    base_new = answered[len(TAUGHT) :]
    for result in [*before.values(), *base_new]:
        assert result.tool_calls == 0, result.messages
    assert _adapter_versions([f"before-{task_id}" for task_id in TAUGHT]) == {""}
    _recorded_whole([(f"before-{task_id}", result) for task_id, result in before.items()])

    # 2. Feedback with action checks on each answer, corrected into the calculator call.
    for task_id, result in before.items():
        call = {"name": "calculator", "arguments": json.dumps({"expression": TAUGHT[task_id]})}
        response = api.post(
            f"/api/v1/traces/before-{task_id}/feedback",
            json={
                "text": FEEDBACK,
                "turn": len(result.messages) - 1,
                "checks": CHECKS,
                "correction": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "call_0", "type": "function", "function": call}],
                },
            },
        )
        assert response.status_code == 201, response.text
    _wait_for(
        lambda: (
            not Feedback.objects.filter(trace__project=project, status=FeedbackStatus.OPEN).exists()
        ),
        120,
        "the corrections to become targets",
        interval_s=2,
    )

    # 3. Retrain, as the button does; the run trains, passes the gate and deploys.
    started = time.monotonic()
    run_id = api.post("/api/v1/runs", json={"mode": "sft"}).json()["id"]
    run = _wait_for(
        lambda: (
            found
            if (found := api.get(f"/api/v1/runs/{run_id}").json())["status"]
            not in ("queued", "building", "training", "evaluating", "deploying")
            else None
        ),
        RUN_TIMEOUT_S,
        "the run to end",
        interval_s=3,
    )
    print(f"\nrun {run['status']} after {time.monotonic() - started:.0f} s; eval {run['eval']}")
    assert run["status"] == "deployed", run
    adapter = Adapter.objects.get(run_id=run_id)

    # 4. New questions, never reviewed, in live episodes through the gateway: the agent now
    # calls the calculator with an expression, reads its result and answers.
    time.sleep(2.5)  # the gateway caches routes for 2 s
    after = _episodes(client, gateway, key, [(task, "after") for task in NEW_TASKS])
    for task, result in zip(NEW_TASKS, after, strict=True):
        print(f"{task.task_id}: {result.termination} success={result.success} {result.messages}")
    assert all(_calculator_calls(result) for result in after), [r.messages for r in after]
    for result in after:
        for function in _calculator_calls(result):
            assert any(ch.isdigit() for ch in json.loads(function["arguments"])["expression"])
    assert _adapter_versions([f"after-{task.task_id}" for task in NEW_TASKS]) == {adapter.name}
