import json
import time
from pathlib import Path

import pytest

from training.checks import check_problem, check_reply, evaluate_checks, tool_result_failed

# Python's re backtracks exponentially on these; a worker running one with re.search hung.
CATASTROPHIC = [
    (r"(a+)+$", "a" * 100_000 + "b"),
    (r"(\w+\s?)*$", "an ordinary answer of sixty-four characters, ending in a dash -"),
]


@pytest.mark.parametrize(("pattern", "text"), CATASTROPHIC)
def test_a_catastrophic_pattern_is_answered_in_linear_time(pattern, text):
    started = time.perf_counter()
    [result] = evaluate_checks([{"kind": "regex", "value": pattern}], text=text)
    assert time.perf_counter() - started < 0.5
    assert result.passed is (pattern != r"(a+)+$")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"(\w+) \1", "invalid escape sequence: \\1"),
        (r"Paris(?= is)", "invalid perl operator: (?="),
        (r"(?<!not )sorry", "invalid perl operator: (?<!"),
    ],
)
def test_patterns_re2_cannot_run_are_refused_naming_the_problem(pattern, words):
    problem = check_problem("regex", pattern)
    assert words in problem
    assert "no backreferences or lookarounds" in problem


def test_an_overlong_pattern_is_refused():
    assert "at most 1000 characters" in check_problem("not_regex", "a" * 1001)


def test_a_pattern_re2_runs_is_accepted():
    assert check_problem("regex", r"(?i)^answer:\s+\d+") is None


def test_checks_pass_and_fail_on_text_and_tool_calls():
    checks = [
        {"kind": "regex", "value": r"(?i)^answer:"},
        {"kind": "not_regex", "value": "sorry"},
        {"kind": "max_words", "value": 2},
        {"kind": "calls_tool", "value": "search"},
    ]
    results = evaluate_checks(checks, text="Answer: sorry, no.", tool_calls=[_call("search")])
    assert [result.passed for result in results] == [True, False, False, True]


def _call(name: str, **arguments) -> dict:
    return {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _hermes(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _passes(check: dict, reply, context=()) -> bool:
    [result] = check_reply([check], reply, context=context)
    return result.passed


QUESTION = [{"role": "user", "content": "How many vacation days do new staff get?"}]
LOOKUP_SCHEMA = {
    "type": "object",
    "properties": {"topic": {"type": "string", "pattern": "^[a-z ]+$"}},
    "required": ["topic"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param("Let me look.\n" + _hermes("lookup", topic="vacation"), id="hermes text"),
        pytest.param(
            {"role": "assistant", "content": None, "tool_calls": [_call("lookup", topic="x")]},
            id="openai tool_calls",
        ),
        pytest.param(
            {"role": "assistant", "content": _hermes("lookup", topic="vacation")},
            id="hermes text in a message",
        ),
    ],
)
def test_a_reply_with_a_tool_call_calls_that_tool(reply):
    assert _passes({"kind": "calls_tool", "value": "lookup"}, reply)
    assert not _passes({"kind": "calls_tool", "value": "calculator"}, reply)
    assert not _passes({"kind": "no_tool_call", "value": True}, reply)


def test_hermes_blocks_are_not_part_of_the_text_a_pattern_sees():
    reply = "Let me look.\n" + _hermes("lookup", topic="vacation")

    assert _passes({"kind": "regex", "value": r"^Let me look\.$"}, reply)
    assert _passes({"kind": "not_regex", "value": "vacation"}, reply)


def test_a_plain_answer_calls_no_tool():
    assert _passes({"kind": "no_tool_call", "value": True}, "25 days.")
    assert _passes({"kind": "no_tool_call", "value": None}, "25 days.")


@pytest.mark.parametrize(
    ("reply", "passed"),
    [
        (_hermes("lookup", topic="vacation days"), True),
        (_hermes("lookup", topic="holidays"), False),
        (_hermes("lookup", query="vacation"), False),  # the argument is missing
        (_hermes("lookup", topic=3), False),  # not a string
        (_hermes("calculator", expression="1+1"), False),  # the tool is not called at all
        (_hermes("lookup", topic="vacation") + _hermes("lookup", topic="pay"), False),
    ],
)
def test_tool_argument_pattern_must_match_every_call_to_the_tool(reply, passed):
    check = {
        "kind": "tool_argument",
        "value": {"tool": "lookup", "argument": "topic", "pattern": "vacation"},
    }
    assert _passes(check, reply) is passed


@pytest.mark.parametrize(
    ("arguments", "passed"),
    [
        ({"topic": "vacation"}, True),
        ({"topic": "Vacation!"}, False),  # the schema's own pattern, run on RE2
        ({"topic": "vacation", "extra": 1}, False),
        ({}, False),
    ],
)
def test_tool_argument_schema_must_fit_the_arguments(arguments, passed):
    check = {"kind": "tool_argument", "value": {"tool": "lookup", "schema": LOOKUP_SCHEMA}}
    assert _passes(check, _hermes("lookup", **arguments)) is passed


def test_malformed_arguments_fit_no_schema():
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{oops"}}
        ],
    }
    check = {"kind": "tool_argument", "value": {"tool": "lookup", "schema": LOOKUP_SCHEMA}}
    assert not _passes(check, reply)


@pytest.mark.parametrize(
    ("value", "passed"),
    [
        ({"max": 2}, False),
        ({"max": 3}, True),
        ({"tool": "lookup", "max": 2}, True),
        ({"tool": "lookup", "max": 1}, False),
        ({"tool": "calculator", "max": 0}, False),
        ({"tool": "clock", "max": 0}, True),
    ],
)
def test_max_tool_calls_bounds_the_calls_in_the_turn(value, passed):
    reply = (
        _hermes("lookup", topic="a")
        + _hermes("lookup", topic="b")
        + _hermes("calculator", expression="1")
    )
    assert _passes({"kind": "max_tool_calls", "value": value}, reply) is passed


def _after_result(result: str) -> list[dict]:
    return [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [_call("lookup", topic="vacation")]},
        {"role": "tool", "tool_call_id": "call_lookup", "content": result},
    ]


ANSWERS_AFTER_SUCCESS = {"kind": "answers_after_tool_success", "value": True}


@pytest.mark.parametrize(
    ("result", "failed"),
    [
        ("New staff get 25 days a year.", False),
        ("Error: tool timed out after 5s", True),
        ("error: no such topic", True),
        ('{"error": "rate limited"}', True),
        ('{"days": 25}', False),
        ("The error rate is low.", False),
        ("  Error: leading space", True),
    ],
)
def test_a_tool_result_fails_when_it_starts_with_error_or_holds_an_error_key(result, failed):
    assert tool_result_failed({"role": "tool", "content": result}) is failed
    answer_passes = _passes(ANSWERS_AFTER_SUCCESS, "New staff get 25 days.", _after_result(result))
    assert answer_passes is not failed


def test_calling_a_tool_again_after_a_failure_is_not_answering():
    context = _after_result("Error: tool timed out after 5s")
    assert _passes(ANSWERS_AFTER_SUCCESS, _hermes("lookup", topic="vacation"), context)


def test_only_the_last_tool_result_counts():
    context = [
        *_after_result("Error: tool timed out after 5s"),
        {"role": "assistant", "content": None, "tool_calls": [_call("lookup", topic="vacation")]},
        {"role": "tool", "tool_call_id": "call_lookup", "content": "25 days."},
    ]
    assert _passes(ANSWERS_AFTER_SUCCESS, "25 days.", context)
    assert not _passes(
        ANSWERS_AFTER_SUCCESS, "25 days.", [*context, *_after_result("Error: again")]
    )


def test_an_answer_with_no_tool_result_before_it_passes():
    assert _passes(ANSWERS_AFTER_SUCCESS, "25 days.", QUESTION)


@pytest.mark.parametrize(
    ("kind", "value", "tool_names", "problem"),
    [
        ("no_tool_call", "yes", (), "value: no_tool_call takes true (or null)"),
        ("answers_after_tool_success", 1, (), "value: answers_after_tool_success takes true"),
        ("tool_argument", "lookup", (), "value: tool_argument needs an object"),
        (
            "tool_argument",
            {"argument": "topic", "pattern": "x"},
            (),
            "value.tool: tool_argument needs a tool name",
        ),
        (
            "tool_argument",
            {"tool": "search", "schema": {}},
            ("lookup",),
            "value.tool: 'search' is not a tool of this trace (lookup)",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "pattern": "x"},
            (),
            "value.argument: tool_argument needs the argument's name",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "argument": "topic"},
            (),
            "value.pattern: a tool_argument check needs a pattern string",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "argument": "topic", "pattern": "(a)\\1"},
            (),
            "value.pattern: not a valid regular expression for RE2",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "argument": "t", "pattern": "x", "schema": {}},
            (),
            "value: tool_argument takes argument and pattern, or schema",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "schema": {"type": "nonsense"}},
            (),
            "value.schema: not a valid JSON Schema (",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "schema": []},
            (),
            "value.schema: not a valid JSON Schema (it must be an object)",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "schema": {"properties": {"t": {"pattern": "(?=x)"}}}},
            (),
            "value.schema: a pattern in it is not a valid regular expression for RE2",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "schema": {"$ref": "https://example.com/s.json"}},
            (),
            "value.schema: 'https://example.com/s.json' points outside the schema",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "schema": {"enum": ["x" * 20_000]}},
            (),
            "value.schema: a schema is at most 10000 bytes",
        ),
        (
            "tool_argument",
            {"tool": "lookup", "name": "x"},
            (),
            "value.name: not a field of tool_argument",
        ),
        ("max_tool_calls", 2, (), "value: max_tool_calls needs an object"),
        (
            "max_tool_calls",
            {"tool": "lookup"},
            (),
            "value.max: max_tool_calls needs a whole number",
        ),
        ("max_tool_calls", {"max": -1}, (), "value.max: max_tool_calls needs a whole number"),
        ("max_tool_calls", {"max": True}, (), "value.max: max_tool_calls needs a whole number"),
        (
            "max_tool_calls",
            {"tool": "search", "max": 1},
            ("lookup",),
            "value.tool: 'search' is not a tool of this trace",
        ),
        ("calls", "lookup", (), "kind: 'calls' is not one of regex, not_regex"),
    ],
)
def test_bad_action_checks_are_refused_naming_the_field(kind, value, tool_names, problem):
    assert check_problem(kind, value, tool_names).startswith(problem)


def _nested(levels: int) -> dict:
    schema: dict = {}
    for _ in range(levels):
        schema = {"not": schema}
    return schema


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (_nested(900), "value.schema: a schema nests at most 32 levels deep"),
        ({"$schema": []}, "value.schema: not a valid JSON Schema ($schema must be a draft's URI)"),
        ({"$ref": "#"}, "value.schema: it refers to itself without end"),
        (
            {"$ref": "#/nowhere"},
            "value.schema: a reference in it points to nothing (PointerToNowhere",
        ),
    ],
)
def test_schemas_the_validator_cannot_run_are_refused(schema, problem):
    assert check_problem("tool_argument", {"tool": "lookup", "schema": schema}).startswith(problem)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("no_tool_call", True),
        ("no_tool_call", None),
        ("answers_after_tool_success", True),
        ("tool_argument", {"tool": "lookup", "argument": "topic", "pattern": "(?i)vacation"}),
        ("tool_argument", {"tool": "lookup", "schema": LOOKUP_SCHEMA}),
        (
            "tool_argument",
            {
                "tool": "lookup",
                "schema": {
                    "$defs": {"t": {"type": "string"}},
                    "properties": {"topic": {"$ref": "#/$defs/t"}},
                },
            },
        ),
        ("max_tool_calls", {"max": 0}),
        ("max_tool_calls", {"tool": "lookup", "max": 2}),
    ],
)
def test_good_action_checks_are_accepted(kind, value):
    assert check_problem(kind, value, ("lookup", "calculator")) is None


def test_the_documented_example_of_each_action_check_is_accepted():
    guide = (Path(__file__).parents[2] / "docs" / "dashboard.md").read_text()
    section = guide.split("## Feedback and checks on a tool call")[1]
    example = json.loads(section.split("```json")[1].split("```")[0])

    kinds = [check["kind"] for check in example["checks"]]
    assert set(kinds) >= {"no_tool_call", "tool_argument", "max_tool_calls"}
    assert "answers_after_tool_success" in kinds
    for check in example["checks"]:
        assert check_problem(check["kind"], check["value"], ("lookup", "calculator")) is None
