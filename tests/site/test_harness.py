"""The demo agent: its tools, its tasks and its loop, against a FAKE model server in-process.

The real run (vLLM serving SmolLM2 behind the gateway) is covered by slow tests elsewhere; here
`FakeModelServer` plays vLLM's chat endpoint through httpx.MockTransport, so these tests are fast.
"""

import ast
import itertools
import json
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest

from reviewapp.harness import agent
from reviewapp.harness.__main__ import parse_args, run_demo, summarize, wait_for_endpoint
from reviewapp.harness.agent import api_base_for, report_outcome, run_episode
from reviewapp.harness.tasks import TASKS, TASKS_BY_ID, numbers_in
from reviewapp.harness.tools import (
    HANDBOOK,
    TOOL_DEFINITIONS,
    TOOL_NAMES,
    ToolEnvironment,
    calculator,
    clock,
    lookup,
)

BASE_URL = "http://gateway.test/v1"
NOON = datetime(2026, 3, 14, 12, 0, tzinfo=UTC)  # a Saturday


class FakeModelServer:
    """A FAKE model server: answers /v1/chat/completions like vLLM with guided tool calling.

    A named tool_choice gets a call of that tool with `arguments[name]`; tool_choice "none" gets
    `answer`; tool_choice "auto" gets the next of `script`'s replies, as a model that chose them
    (a tool call, or an answer). Every request is kept for the assertions.
    """

    def __init__(self, *, answer: str = "The answer is 84.", arguments: dict | None = None):
        self.answer = answer
        self.script: list[dict] = []
        self.arguments = {
            "calculator": ['{"expression": "12 * 7"}'],
            "lookup": ['{"topic": "refunds"}'],
            "clock": ['{"timezone": "UTC"}'],
            **(arguments or {}),
        }
        self.requests: list[httpx.Request] = []
        self.status_code = 200

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status_code != 200:
            return httpx.Response(self.status_code, json={"error": {"message": "upstream"}})
        body = json.loads(request.content)
        choice = body["tool_choice"]
        if choice == "auto":
            message = self.script.pop(0)
        elif choice == "none":
            message = {"role": "assistant", "content": self.answer, "refusal": None}
        else:
            name = choice["function"]["name"]
            queued = self.arguments[name]
            arguments = queued.pop(0) if len(queued) > 1 else queued[0]
            call_number = len(self.requests)
            message = {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"chatcmpl-tool-{call_number}",
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message}]})

    def bodies(self) -> list[dict]:
        return [json.loads(request.content) for request in self.requests]


@pytest.fixture
def server() -> FakeModelServer:
    return FakeModelServer()


@pytest.fixture
def client(server):
    with httpx.Client(transport=httpx.MockTransport(server.handle)) as client:
        yield client


def _run(
    client,
    *,
    task_id="calc-multiply",
    env=None,
    budget=5.0,
    max_steps=3,
    trace_id=None,
    tool_choice="named",
    instructions="",
):
    return run_episode(
        client,
        base_url=BASE_URL,
        api_key="key-123",
        model="smol",
        task=TASKS_BY_ID[task_id],
        env=env or ToolEnvironment(now=NOON),
        time_budget_s=budget,
        max_steps=max_steps,
        trace_id=trace_id,
        tool_choice=tool_choice,
        instructions=instructions,
    )


def _roles(messages: list[dict]) -> list[str]:
    return [message["role"] for message in messages]


# Tools


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("12 * 7", "84"),
        ("(15 + 5) * 3", "60"),
        ("2 + 3 * 4", "14"),
        ("-25 + 10", "-15"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("100 % 7", "2"),
        ("2 ** 10", "1024"),
        ("2^10", "1024"),
        ("1.5 * 4", "6"),
    ],
)
def test_calculator_evaluates_arithmetic(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "os.system('ls')", "x + 1", "[1, 2]", "(lambda: 1)()", "True + 1"],
)
def test_calculator_refuses_anything_but_arithmetic(expression):
    assert calculator(expression).startswith("Error:")


@pytest.mark.parametrize("expression", ["9 ** 9 ** 9", "2 ** 1000", "10 ** 20 * 10 ** 20"])
def test_calculator_refuses_huge_numbers_quickly(expression):
    started = time.monotonic()
    assert calculator(expression).startswith("Error:")
    assert time.monotonic() - started < 0.5


def test_calculator_reports_division_by_zero_and_bad_syntax():
    assert calculator("1 / 0") == "Error: division by zero"
    assert calculator("12 *").startswith("Error: could not parse")


def test_lookup_returns_a_document_even_for_a_loose_topic():
    assert lookup("refunds") == HANDBOOK["refunds"]
    assert lookup("Refund policy") == HANDBOOK["refunds"]
    assert lookup("support") == HANDBOOK["support hours"]


def test_lookup_of_an_unknown_topic_says_there_is_no_document():
    assert lookup("astrology").startswith("No document about 'astrology'")


def test_clock_tells_the_fixed_time():
    assert clock(NOON) == "Saturday 2026-03-14T12:00:00Z"


def test_tool_definitions_are_strict_and_name_every_tool():
    assert TOOL_NAMES == ("calculator", "lookup", "clock")
    for definition in TOOL_DEFINITIONS:
        parameters = definition["function"]["parameters"]
        assert definition["function"]["strict"] is True
        assert parameters["required"] == list(parameters["properties"])


def test_environment_runs_the_named_tool():
    env = ToolEnvironment(now=NOON)
    assert env.run("calculator", '{"expression": "6 * 7"}').content == "42"
    assert env.run("clock", '{"timezone": "UTC"}').content == "Saturday 2026-03-14T12:00:00Z"
    assert (env.calls, env.failures) == (2, 0)


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("calculator", "not json"),
        ("calculator", '{"expr": "1"}'),
        ("calculator", "[1]"),
        ("weather", "{}"),
        ("clock", '{"timezone": "CET"}'),
    ],
)
def test_environment_turns_bad_calls_into_tool_errors(name, arguments):
    env = ToolEnvironment()
    result = env.run(name, arguments)
    assert result.failed and result.content.startswith("Error:")
    assert (env.failures, env.injected_failures) == (1, 0)


def test_injected_failures_follow_the_rate():
    env = ToolEnvironment(failure_rate=0.1, seed=7)
    results = [env.run("clock", "{}") for _ in range(1000)]
    assert 70 <= env.injected_failures <= 130
    assert env.failures == env.injected_failures == sum(result.failed for result in results)
    assert "(injected)" in next(result.content for result in results if result.failed)


def test_the_same_seed_fails_the_same_calls():
    def pattern(seed: int) -> list[bool]:
        env = ToolEnvironment(failure_rate=0.5, seed=seed)
        return [env.run("clock", "{}").failed for _ in range(50)]

    assert pattern(3) == pattern(3)
    assert pattern(3) != pattern(4)


def test_environment_sleeps_its_latency():
    env = ToolEnvironment(latency_s=0.05)
    started = time.monotonic()
    env.run("clock", "{}")
    assert time.monotonic() - started >= 0.05


def test_a_tool_slower_than_its_timeout_is_abandoned_at_the_timeout():
    env = ToolEnvironment(latency_s=5.0)
    started = time.monotonic()
    result = env.run("clock", "{}", timeout_s=0.05)
    assert result.timed_out and result.failed
    assert time.monotonic() - started < 1.0


# Tasks


def test_tasks_are_many_unique_and_use_real_tools():
    assert len(TASKS) >= 24
    assert len(TASKS_BY_ID) == len(TASKS)
    assert {task.tool for task in TASKS} == set(TOOL_NAMES)


def test_number_checker_finds_the_number_in_a_sentence():
    task = TASKS_BY_ID["calc-multiply"]
    assert task.is_correct("12 times 7 is 84.", now=NOON)
    assert not task.is_correct("12 times 7 is 88.", now=NOON)
    assert TASKS_BY_ID["calc-negative"].is_correct("25 - 40 = -15", now=NOON)
    assert numbers_in("It costs 1,024.50 in total") == [1024.5]


def test_phrase_checker_matches_whole_words_only():
    task = TASKS_BY_ID["docs-warranty-damage"]
    assert task.is_correct("No, it is not covered.", now=NOON)
    assert not task.is_correct("I know it is covered.", now=NOON)


def test_time_checker_compares_with_the_clock():
    task = TASKS_BY_ID["time-weekday"]
    assert task.is_correct("Today is Saturday.", now=NOON)
    assert not task.is_correct("Today is Monday.", now=NOON)


def test_every_handbook_task_is_answered_by_some_document():
    for task in TASKS:
        if task.tool == "lookup":
            assert any(task.is_correct(doc, now=NOON) for doc in HANDBOOK.values()), task.task_id


# The agent loop


def test_an_episode_calls_the_tool_then_answers(client, server):
    result = _run(client)

    assert result.termination == "completed" and result.success
    assert _roles(result.messages) == ["system", "user", "assistant", "tool", "assistant"]
    assert result.messages[2]["tool_calls"][0]["function"]["name"] == "calculator"
    tool_message = {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "84"}
    assert result.messages[3] == tool_message
    assert result.answer == "The answer is 84."
    assert (result.tool_calls, result.tool_failures) == (1, 0)


def test_the_tool_step_names_the_tool_and_the_answer_step_forbids_tools(client, server):
    _run(client, task_id="docs-refund-window")

    tool_step, answer_step = server.bodies()
    assert tool_step["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert answer_step["tool_choice"] == "none"
    assert tool_step["tools"] == answer_step["tools"] == TOOL_DEFINITIONS
    assert tool_step["model"] == "smol" and tool_step["temperature"] == 0


def test_a_wrong_answer_completes_without_success(client, server):
    server.answer = "It is 88."
    result = _run(client)
    assert result.termination == "completed" and not result.success


def test_an_injected_tool_failure_still_gets_an_answer(client, server):
    result = _run(client, env=ToolEnvironment(failure_rate=1.0), max_steps=2)

    assert result.termination == "tool_error" and not result.success
    assert _roles(result.messages) == ["system", "user", "assistant", "tool", "assistant"]
    assert "(injected)" in result.messages[3]["content"]
    assert result.tool_failures == 1


def test_a_failed_tool_is_called_again_while_a_step_is_left(client, server):
    server.arguments["calculator"] = ['{"expression": "twelve"}', '{"expression": "12*7"}']
    result = _run(client, max_steps=3)

    assert result.termination == "completed" and result.success
    assert _roles(result.messages)[2:] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert (result.tool_calls, result.tool_failures) == (2, 1)


def test_a_tool_that_keeps_failing_ends_in_tool_error(client, server):
    result = _run(client, env=ToolEnvironment(failure_rate=1.0), max_steps=3)
    assert result.termination == "tool_error"
    assert len(server.requests) == 3 and result.tool_failures == 2


def test_a_slow_tool_past_the_budget_times_out(client, server):
    started = time.monotonic()
    result = _run(client, env=ToolEnvironment(latency_s=5.0), budget=0.2)

    assert result.termination == "timeout" and not result.success
    assert time.monotonic() - started < 1.0
    assert len(server.requests) == 1


def test_a_server_that_does_not_answer_in_time_times_out():
    def too_slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with httpx.Client(transport=httpx.MockTransport(too_slow)) as client:
        result = _run(client)
    assert result.termination == "timeout"


def test_an_http_error_ends_the_episode_in_error(client, server):
    server.status_code = 500
    result = _run(client)

    assert result.termination == "error" and not result.success
    assert result.error == 'HTTP 500: {"error":{"message":"upstream"}}'
    assert _roles(result.messages) == ["system", "user"]


def test_a_reply_that_is_not_a_chat_completion_is_an_error():
    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>proxy</html>")

    with httpx.Client(transport=httpx.MockTransport(garbage)) as client:
        result = _run(client)
    assert result.termination == "error" and "not a chat completion" in result.error


def test_a_reply_without_a_tool_call_is_taken_as_the_answer():
    def answers_directly(request: httpx.Request) -> httpx.Response:
        message = {"role": "assistant", "content": "84"}
        return httpx.Response(200, json={"choices": [{"message": message}]})

    with httpx.Client(transport=httpx.MockTransport(answers_directly)) as client:
        result = _run(client)
    assert result.termination == "completed" and result.success
    assert _roles(result.messages) == ["system", "user", "assistant"]


def test_one_step_is_not_enough_for_an_answer(client, server):
    result = _run(client, max_steps=1)
    assert result.termination == "max_steps" and not result.success
    assert _roles(result.messages)[-1] == "tool"


def test_the_trace_id_header_is_sent_when_given(client, server):
    _run(client, trace_id="demo-0-abc-1")
    assert [request.headers["X-Trace-Id"] for request in server.requests] == ["demo-0-abc-1"] * 2
    assert server.requests[0].headers["Authorization"] == "Bearer key-123"


def test_no_trace_id_header_without_a_trace_id(client, server):
    _run(client)
    assert all("X-Trace-Id" not in request.headers for request in server.requests)


def test_every_request_extends_the_previous_conversation(client, server):
    server.arguments["calculator"] = ['{"expression": "twelve"}', '{"expression": "12*7"}']
    result = _run(client, max_steps=3)

    sent = [body["messages"] for body in server.bodies()]
    assert len(sent) == 3
    for earlier, later in itertools.pairwise(sent):
        assert later[: len(earlier)] == earlier
        assert later[len(earlier)]["role"] == "assistant"
    assert result.messages[: len(sent[-1])] == sent[-1]


# The model choosing its tools (tool_choice "auto")


def _calls(name: str, arguments: str, call_id: str) -> dict:
    function = {"name": name, "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _answer(text: str) -> dict:
    return {"role": "assistant", "content": text}


REFUND_LOOKUP = '{"topic": "refunds"}'
# Seed 1 at a 50% failure rate: the first call fails (injected), the second goes through.
FAILS_ONCE = {"failure_rate": 0.5, "seed": 1, "now": NOON}


def test_in_auto_mode_the_model_retries_an_injected_failure_then_answers(client, server):
    server.script = [
        _calls("lookup", REFUND_LOOKUP, "call_a"),
        _calls("lookup", REFUND_LOOKUP, "call_b"),
        _answer("You have 30 days to ask for a refund."),
    ]
    env = ToolEnvironment(**FAILS_ONCE)

    result = _run(client, task_id="docs-refund-window", env=env, tool_choice="auto")

    assert result.termination == "completed" and result.success
    assert result.messages[2:] == [
        _calls("lookup", REFUND_LOOKUP, "call_a"),
        {
            "role": "tool",
            "tool_call_id": "call_a",
            "content": "Error: lookup service unavailable (injected)",
        },
        _calls("lookup", REFUND_LOOKUP, "call_b"),
        {"role": "tool", "tool_call_id": "call_b", "content": HANDBOOK["refunds"]},
        _answer("You have 30 days to ask for a refund."),
    ]
    assert (result.tool_calls, result.tool_failures, env.injected_failures) == (2, 1, 1)


def test_in_auto_mode_every_step_offers_the_tools_and_lets_the_model_choose(client, server):
    server.script = [_calls("lookup", REFUND_LOOKUP, "call_a"), _answer("30 days.")]

    _run(client, task_id="docs-refund-window", tool_choice="auto")

    bodies = server.bodies()
    assert [body["tool_choice"] for body in bodies] == ["auto", "auto"]
    assert all(body["tools"] == TOOL_DEFINITIONS for body in bodies)
    assert "Call a tool when the question needs one" in bodies[0]["messages"][0]["content"]


def test_instructions_are_appended_to_the_system_message(client, server):
    server.script = [_answer("It is 84.")]

    _run(client, tool_choice="auto", instructions="Use the calculator for arithmetic.")

    system = server.bodies()[0]["messages"][0]["content"]
    assert system.startswith("You are a helpful assistant with three tools")
    assert system.endswith("the tool result.\nUse the calculator for arithmetic.")


def test_in_auto_mode_a_model_may_answer_without_a_tool(client, server):
    server.script = [_answer("It is 84.")]

    result = _run(client, tool_choice="auto")

    assert result.termination == "completed" and result.success
    assert _roles(result.messages) == ["system", "user", "assistant"]
    assert result.tool_calls == 0


def test_in_auto_mode_an_answer_right_after_a_failed_tool_ends_in_tool_error(client, server):
    server.script = [_calls("lookup", REFUND_LOOKUP, "call_a"), _answer("It is 30 days.")]

    result = _run(
        client,
        task_id="docs-refund-window",
        env=ToolEnvironment(**FAILS_ONCE),
        tool_choice="auto",
    )

    assert result.termination == "tool_error" and not result.success
    assert _roles(result.messages)[2:] == ["assistant", "tool", "assistant"]


def test_in_auto_mode_a_model_that_keeps_calling_tools_runs_out_of_steps(client, server):
    server.script = [_calls("clock", "{}", f"call_{n}") for n in range(3)]

    result = _run(client, tool_choice="auto", max_steps=3)

    assert result.termination == "max_steps" and not result.success
    assert (len(server.requests), result.tool_calls) == (3, 3)


def test_in_auto_mode_a_slow_tool_past_the_budget_times_out(client, server):
    server.script = [_calls("clock", "{}", "call_a"), _answer("noon")]

    result = _run(client, env=ToolEnvironment(latency_s=5.0), budget=0.2, tool_choice="auto")

    assert result.termination == "timeout"
    assert len(server.requests) == 1


def test_the_cli_chooses_named_tools_unless_told_auto(client, server):
    common = ["--api-key", "k", "--model", "m"]
    assert parse_args(common).tool_choice == "named"
    args = parse_args(
        [
            *common,
            *("--base-url", BASE_URL, "--episodes", "1", "--tool-failure-rate", "0"),
            *("--no-report-outcomes", "--tool-choice", "auto"),
        ]
    )
    server.script = [_answer("It is 84.")]

    [result] = run_demo(args, client)

    assert server.bodies()[0]["tool_choice"] == "auto"
    assert result.termination == "completed"
    with pytest.raises(SystemExit):
        parse_args([*common, "--tool-choice", "any"])


# Outcomes and the CLI


def test_api_base_is_the_base_url_without_v1():
    assert api_base_for("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    with pytest.raises(ValueError):
        api_base_for("http://127.0.0.1:8000/openai")


def test_the_outcome_is_posted_once_the_trace_exists(client, server, monkeypatch):
    monkeypatch.setattr(agent.time, "sleep", lambda seconds: None)
    result = _run(client)
    posted: list[httpx.Request] = []

    def product(request: httpx.Request) -> httpx.Response:
        posted.append(request)
        return httpx.Response(404 if len(posted) < 3 else 200, json={})

    with httpx.Client(transport=httpx.MockTransport(product)) as outcome_client:
        report_outcome(
            outcome_client, base_url=BASE_URL, api_key="key-123", trace_id="t-1", result=result
        )
    assert len(posted) == 3
    assert str(posted[-1].url) == "http://gateway.test/api/v1/traces/t-1/outcome"
    assert json.loads(posted[-1].content) == {"success": True, "termination": "completed"}
    assert posted[-1].headers["Authorization"] == "Bearer key-123"


def test_an_outcome_for_a_missing_trace_raises_after_the_retries(client, monkeypatch):
    monkeypatch.setattr(agent.time, "sleep", lambda seconds: None)
    result = _run(client)
    with (
        httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(404))) as missing,
        pytest.raises(httpx.HTTPStatusError),
    ):
        report_outcome(missing, base_url=BASE_URL, api_key="k", trace_id="t-1", result=result)


def test_outcomes_are_reported_by_default_only_with_trace_ids():
    common = ["--api-key", "k", "--model", "m"]
    assert parse_args(common).report_outcomes is True
    assert parse_args([*common, "--no-trace-ids"]).report_outcomes is False
    with pytest.raises(SystemExit):
        parse_args([*common, "--no-trace-ids", "--report-outcomes"])


def test_the_demo_runs_every_episode_with_unique_trace_ids(client, server, capsys):
    args = parse_args(
        [
            *("--base-url", BASE_URL, "--api-key", "k", "--model", "m", "--episodes", "4"),
            *("--tool-failure-rate", "0", "--concurrency", "2", "--no-report-outcomes"),
        ]
    )
    results = run_demo(args, client)

    assert len(results) == 4
    trace_ids = {request.headers["X-Trace-Id"] for request in server.requests}
    assert len(trace_ids) == 4 and all(tid.startswith("demo-0-") for tid in trace_ids)
    assert capsys.readouterr().out.count("[") >= 4
    assert summarize(results).startswith("summary: completed ")


def test_the_summary_counts_terminations_and_answer_length():
    result = agent.EpisodeResult(
        task_id="calc-add",
        messages=[{"role": "assistant", "content": "It is 936."}],
        termination="completed",
        success=True,
        tool_calls=1,
        tool_failures=0,
        elapsed_s=1.0,
    )
    line = summarize([result, result])
    assert "completed 2" in line and "success 2/2 (100%)" in line
    assert "mean answer 3.0 words" in line


def test_the_harness_imports_nothing_from_the_product():
    """A black box like a customer's harness: stdlib, httpx and its own modules only."""
    package = Path(agent.__file__).parent
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith("django"), (source.name, name)
                assert not name.startswith("reviewapp") or name.startswith("reviewapp.harness")


@pytest.mark.parametrize(
    "flags", [["--episodes", "0"], ["--tool-failure-rate", "1.5"], ["--time-budget", "0"]]
)
def test_the_cli_refuses_impossible_settings(flags):
    with pytest.raises(SystemExit):
        parse_args(["--api-key", "k", "--model", "m", *flags])


def test_the_harness_waits_for_an_endpoint_that_is_still_starting():
    """bin/run starts the harness as soon as the model answers; with a model server already
    running that is before the web process listens, and every episode was refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    servers = []

    def start_late():
        time.sleep(1.0)
        servers.append(HTTPServer(("127.0.0.1", port), NotFound))
        servers[0].serve_forever()

    threading.Thread(target=start_late, daemon=True).start()
    started = time.monotonic()
    with httpx.Client() as client:
        wait_for_endpoint(client, f"http://127.0.0.1:{port}/v1", timeout_s=20)
        waited = time.monotonic() - started
        answered = client.get(f"http://127.0.0.1:{port}/v1/models").status_code
    servers[0].shutdown()

    assert 1.0 <= waited < 20
    assert answered == 404  # it answers: the episodes can start


def test_the_harness_stops_waiting_after_its_limit():
    started = time.monotonic()
    with httpx.Client() as client:
        wait_for_endpoint(client, "http://127.0.0.1:9/v1", timeout_s=0.5)

    assert 0.5 <= time.monotonic() - started < 5
