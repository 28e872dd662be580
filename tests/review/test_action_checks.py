"""Checks on actions (no_tool_call, tool_argument, max_tool_calls, answers_after_tool_success):
stored from the API and the dashboard form, and refused with a 422 naming the field."""

import json

import pytest
from django.test import Client

from reviewapp.review.models import Feedback
from reviewapp.traces.models import Trace
from tests.factories import make_trace

FEEDBACK = "/api/v1/traces/t-1/feedback"
EXPRESSION_SCHEMA = {
    "type": "object",
    "properties": {"expression": {"type": "string", "pattern": "^[0-9*+ -]+$"}},
    "required": ["expression"],
}
GOOD_CHECKS = [
    {"kind": "no_tool_call", "value": True},
    {
        "kind": "tool_argument",
        "value": {"tool": "calculator", "argument": "expression", "pattern": r"\*"},
    },
    {"kind": "tool_argument", "value": {"tool": "calculator", "schema": EXPRESSION_SCHEMA}},
    {"kind": "max_tool_calls", "value": {"tool": "calculator", "max": 1}},
    {"kind": "answers_after_tool_success", "value": True},
]

NESTED_40: dict = {}
for _ in range(40):
    NESTED_40 = {"not": NESTED_40}


@pytest.fixture
def stored(api, project):
    api.post("/api/v1/traces", {"traces": [make_trace("t-1")]})
    return Trace.objects.get(project=project, external_id="t-1")


@pytest.mark.parametrize("check", GOOD_CHECKS, ids=lambda check: check["kind"])
def test_an_action_check_is_stored_from_the_api(api, stored, check):
    response = api.post(
        FEEDBACK, {"text": "Compute it with the tool.", "turn": 2, "checks": [check]}
    )

    assert response.status_code == 201
    assert Feedback.objects.get(trace=stored).checks == [check]


@pytest.mark.parametrize(
    ("check", "words"),
    [
        (
            {"kind": "tool_argument", "value": {"tool": "calculator", "schema": {"type": 12}}},
            "checks[0].value.schema: not a valid JSON Schema (",
        ),
        (
            {"kind": "tool_argument", "value": {"tool": "search", "argument": "q", "pattern": "x"}},
            "checks[0].value.tool: 'search' is not a tool of this trace (calculator)",
        ),
        (
            {
                "kind": "tool_argument",
                "value": {"tool": "calculator", "argument": "expression", "pattern": "(?=1)"},
            },
            "checks[0].value.pattern: not a valid regular expression for RE2",
        ),
        (
            {"kind": "tool_argument", "value": {"tool": "calculator"}},
            "checks[0].value.argument: tool_argument needs the argument's name, or a schema",
        ),
        (
            {"kind": "max_tool_calls", "value": {"max": "two"}},
            "checks[0].value.max: max_tool_calls needs a whole number of calls",
        ),
        (
            {"kind": "max_tool_calls", "value": {"tool": "search", "max": 1}},
            "checks[0].value.tool: 'search' is not a tool of this trace",
        ),
        (
            {"kind": "tool_argument", "value": {"tool": "calculator", "schema": NESTED_40}},
            "checks[0].value.schema",  # the API's own depth limit answers first, naming the path
        ),
        (
            {"kind": "no_tool_call", "value": "calculator"},
            "checks[0].value: no_tool_call takes true",
        ),
        (
            {"kind": "answers_after_tool_success", "value": 0},
            "checks[0].value: answers_after_tool_success",
        ),
    ],
)
def test_a_bad_action_check_is_422_naming_the_field(api, stored, check, words):
    response = api.post(
        FEEDBACK, {"text": "x", "turn": 2, "checks": [{"kind": "regex", "value": "84"}, check]}
    )

    assert response.status_code == 422
    assert words.replace("checks[0]", "checks[1]") in response.json()["detail"]
    assert not Feedback.objects.exists()


def _post_form(user, trace, fields: dict):
    client = Client()
    client.force_login(user)
    return client.post(
        f"/p/acme/traces/{trace.pk}/feedback/",
        {"anchor": "turn:2", "text": "Compute it with the tool.", **fields},
        headers={"HX-Request": "true"},
    )


def test_the_form_stores_every_action_check(bob, stored):
    response = _post_form(
        bob,
        stored,
        {
            "check_no_tool_call": "on",
            "check_argument_tool": "calculator",
            "check_argument_name": "expression",
            "check_argument_pattern": r"\*",
            "check_max_tool_calls": "1",
            "check_max_tool_calls_tool": "calculator",
            "check_answers_after_tool_success": "on",
        },
    )

    assert response.status_code == 200
    assert Feedback.objects.get().checks == [
        GOOD_CHECKS[0],
        GOOD_CHECKS[4],
        GOOD_CHECKS[1],
        GOOD_CHECKS[3],
    ]


def test_the_form_stores_a_schema_check(bob, stored):
    response = _post_form(
        bob,
        stored,
        {
            "check_argument_tool": "calculator",
            "check_argument_schema": json.dumps(EXPRESSION_SCHEMA),
        },
    )

    assert response.status_code == 200
    assert Feedback.objects.get().checks == [GOOD_CHECKS[2]]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {"check_argument_tool": "calculator", "check_argument_schema": "{not json"},
            "not valid JSON",
        ),
        (
            {"check_argument_tool": "calculator", "check_argument_schema": '{"type": 12}'},
            "not a valid JSON Schema (",
        ),
        (
            {
                "check_argument_tool": "calculator",
                "check_argument_name": "expression",
                "check_argument_pattern": "(a)\\1",
            },
            "not a valid regular expression for RE2",
        ),
        (
            {"check_argument_name": "expression", "check_argument_pattern": "x"},
            "tool_argument needs a tool name",
        ),
        (
            {"check_argument_tool": "calculator", "check_argument_schema": "[" * 5000 + "]" * 5000},
            "not valid JSON",
        ),
        ({"check_max_tool_calls_tool": "calculator"}, "give the most calls the tool may have"),
        ({"check_max_tool_calls": "-1"}, "greater than or equal to 0"),
        (
            {"check_argument_tool": "search", "check_argument_schema": "{}"},
            "checks[0].value.tool: &#x27;search&#x27; is not a tool of this trace",
        ),
    ],
)
def test_the_form_shows_a_bad_action_check_and_stores_nothing(bob, stored, fields, words):
    response = _post_form(bob, stored, fields)

    assert response.status_code == 422
    assert words in response.content.decode()
    assert not Feedback.objects.exists()
