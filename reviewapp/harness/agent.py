"""One episode of the demo agent: call a tool, read its result, answer; every step over HTTP.

The agent only knows a base URL, an API key and a model name, like a customer's harness. Each
request carries the whole conversation so far, which is how the gateway groups the calls of an
episode into one trace (and `X-Trace-Id` names that trace when given).

Two ways to choose tools (TOOL_CHOICES): "named" makes the model call the task's tool first and
forbids tools for the answer, so every episode has the same shape; "auto" offers the tools on
every step with tool_choice "auto", so whether the model calls a tool, which one, whether it
retries after a failure and when it answers are its own choices, and show in the trace.
"""

import time
from dataclasses import dataclass
from typing import Literal

import httpx

from reviewapp.harness.tasks import Task
from reviewapp.harness.tools import HANDBOOK, TOOL_DEFINITIONS, ToolEnvironment

# The tools in plain words beside their definitions (which the bundled model's chat template
# renders as well): a 135M model follows prose better than a JSON schema.
_TOOLS_IN_WORDS = (
    "You are a helpful assistant with three tools:\n"
    "- calculator: evaluates an arithmetic expression written with numbers and + - * / ( ), "
    'for example "12 * 7".\n'
    f"- lookup: reads the handbook document on a topic: {', '.join(HANDBOOK)}.\n"
    "- clock: tells the current UTC date and time.\n"
)
SYSTEM_PROMPT = (
    _TOOLS_IN_WORDS
    + "Call the tool, then answer the question in one short sentence using the tool result."
)
AUTO_SYSTEM_PROMPT = (
    _TOOLS_IN_WORDS
    + "Call a tool when the question needs one, then answer in one short sentence using "
    "the tool result."
)
ToolChoice = Literal["named", "auto"]
TOOL_CHOICES: tuple[ToolChoice, ...] = ("named", "auto")
# vLLM forces the call's envelope ('<tool_call>\n{"name": ..., "arguments": ') token by token:
# about 30 tokens before the first argument character.
TOOL_STEP_MAX_TOKENS = 96
ANSWER_MAX_TOKENS = 48
OUTCOME_TIMEOUT_S = 10.0
OUTCOME_ATTEMPTS = 5  # the gateway records after it answers: the trace can lag the episode


@dataclass(frozen=True)
class EpisodeResult:
    task_id: str
    messages: list[dict]
    termination: str  # completed | timeout | tool_error | max_steps | error
    success: bool
    tool_calls: int
    tool_failures: int
    elapsed_s: float
    error: str = ""  # what went wrong, for termination "error"

    @property
    def answer(self) -> str:
        """The final assistant text, "" when the episode ended before one."""
        last = self.messages[-1]
        if last["role"] != "assistant" or last.get("tool_calls"):
            return ""
        return last.get("content") or ""


class _BadReply(Exception):
    """An error status, or a 200 that is not a chat completion; the message says which."""


def _post_chat(
    client: httpx.Client,
    *,
    base_url: str,
    api_key: str,
    trace_id: str | None,
    body: dict,
    timeout_s: float,
) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"}
    if trace_id:
        headers["X-Trace-Id"] = trace_id
    response = client.post(
        f"{base_url.rstrip('/')}/chat/completions", json=body, headers=headers, timeout=timeout_s
    )
    if response.is_error:
        raise _BadReply(f"HTTP {response.status_code}: {response.text[:300]}")
    try:
        message = response.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise _BadReply(f"not a chat completion: {response.text[:200]!r}") from error
    if not isinstance(message, dict):
        raise _BadReply("choices[0].message is not an object")
    # Kept as returned, minus vLLM's null extras (refusal, audio, ...) the next request needn't see.
    assistant = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        assistant["tool_calls"] = message["tool_calls"]
    return assistant


def run_episode(
    client: httpx.Client,
    *,
    base_url: str,
    api_key: str,
    model: str,
    task: Task,
    env: ToolEnvironment,
    time_budget_s: float,
    max_steps: int,
    trace_id: str | None = None,
    tool_choice: ToolChoice = "named",
    instructions: str = "",
) -> EpisodeResult:
    """Run one task to an answer or a termination; never raises for server or tool trouble.

    Steps are model calls. "named": the first forces the task's tool; a failed tool is called
    again while a step is left for the answer after it; the answer step has tool_choice "none".
    "auto": every step offers the tools and the model decides. Either way a reply without tool
    calls is the answer (after a failed tool result the episode ends in `tool_error`), every
    call runs in the environment with its injected failures and latency, and the time budget
    covers the whole episode, tools included. `instructions` are appended to the system
    message (feedback given in the prompt, the baseline a trained lesson is compared with).
    """
    if tool_choice not in TOOL_CHOICES:
        raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}")
    started = time.monotonic()
    deadline = started + time_budget_s
    system_prompt = AUTO_SYSTEM_PROMPT if tool_choice == "auto" else SYSTEM_PROMPT
    messages: list[dict] = [
        {"role": "system", "content": f"{system_prompt}\n{instructions}".strip()},
        {"role": "user", "content": task.question},
    ]
    tool_calls = tool_failures = steps = 0
    last_tool_failed: bool | None = None  # None until a tool has run

    def finish(termination: str, *, success: bool = False, error: str = "") -> EpisodeResult:
        return EpisodeResult(
            task_id=task.task_id,
            messages=messages,
            termination=termination,
            success=success,
            tool_calls=tool_calls,
            tool_failures=tool_failures,
            elapsed_s=time.monotonic() - started,
            error=error,
        )

    while steps < max_steps:
        if tool_choice == "auto":
            choice, max_tokens = "auto", TOOL_STEP_MAX_TOKENS  # room for a call or an answer
        elif last_tool_failed is None or (last_tool_failed and max_steps - steps >= 2):
            choice = {"type": "function", "function": {"name": task.tool}}
            max_tokens = TOOL_STEP_MAX_TOKENS
        else:
            choice, max_tokens = "none", ANSWER_MAX_TOKENS
        body = {
            "model": model,
            "messages": messages,
            "tools": TOOL_DEFINITIONS,
            "tool_choice": choice,
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return finish("timeout")
        try:
            assistant = _post_chat(
                client,
                base_url=base_url,
                api_key=api_key,
                trace_id=trace_id,
                body=body,
                timeout_s=remaining,
            )
        except httpx.TimeoutException:
            return finish("timeout")
        except (httpx.HTTPError, _BadReply) as error:
            return finish("error", error=str(error) or type(error).__name__)
        steps += 1
        if time.monotonic() > deadline:
            return finish("timeout")  # httpx's timeout is per read, not for the whole request
        messages.append(assistant)

        if not assistant.get("tool_calls"):
            if last_tool_failed:
                return finish("tool_error")
            answer = assistant.get("content") or ""
            return finish("completed", success=task.is_correct(answer, now=env.now()))

        last_tool_failed = False
        for call in assistant["tool_calls"]:
            function = call.get("function") or {}
            result = env.run(
                str(function.get("name", "")),
                str(function.get("arguments", "")),
                timeout_s=deadline - time.monotonic(),
            )
            tool_calls += 1
            tool_failures += result.failed
            if result.timed_out:
                return finish("timeout")
            last_tool_failed = last_tool_failed or result.failed
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id", ""), "content": result.content}
            )
    return finish("max_steps")


def api_base_for(base_url: str) -> str:
    """The product's root URL from the gateway's OpenAI base URL (".../v1")."""
    trimmed = base_url.rstrip("/")
    if not trimmed.endswith("/v1"):
        raise ValueError(f"expected a base URL ending in /v1, got {base_url!r}")
    return trimmed.removesuffix("/v1")


def report_outcome(
    client: httpx.Client,
    *,
    base_url: str,
    api_key: str,
    trace_id: str,
    result: EpisodeResult,
) -> None:
    """POST the episode's success and termination to its trace; raises httpx.HTTPError."""
    url = f"{api_base_for(base_url)}/api/v1/traces/{trace_id}/outcome"
    payload = {"success": result.success, "termination": result.termination}
    headers = {"Authorization": f"Bearer {api_key}"}
    for attempt in range(OUTCOME_ATTEMPTS):
        response = client.post(url, json=payload, headers=headers, timeout=OUTCOME_TIMEOUT_S)
        if response.status_code != 404 or attempt == OUTCOME_ATTEMPTS - 1:
            break
        time.sleep(0.25 * 2**attempt)
    response.raise_for_status()
