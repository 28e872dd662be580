"""Feedback checks: machine-checkable expectations on one assistant turn, in time linear in it.

A check sees the candidate turn (its text and its tool calls) and the episode up to it (the
messages before the turn). Kinds and their values:
- `regex`, `not_regex` (an RE2 pattern): the turn's text matches, or does not.
- `max_words` (n): the text has at most n words.
- `calls_tool` (a tool name): the turn calls that tool; `no_tool_call` (true): it calls none.
- `tool_argument` (`{"tool", "argument", "pattern"}` or `{"tool", "schema"}`): every call to that
  tool, and at least one, has that argument as a string matching the RE2 pattern, or has an
  arguments object valid under the JSON Schema.
- `max_tool_calls` (`{"tool"?, "max"}`): at most `max` calls in the turn (to that tool, if named).
- `answers_after_tool_success` (true): the turn answers in text only when the last tool result
  before it did not fail (see `tool_result_failed`); a turn that calls a tool passes, and so does
  an answer with no tool result before it.

A reply given as text (what a model wrote) is read in the hermes format: `<tool_call>` blocks are
its tool calls, the rest its text; a message in OpenAI's shape brings its own `tool_calls`.

Patterns run on RE2 (google-re2), whose matching time grows with the text, never exponentially:
a catastrophic pattern such as `(a+)+$` cannot hold up the worker that runs it. RE2 refuses what
needs backtracking (backreferences, lookarounds); `check_problem` names it, so the API and the
dashboard turn such feedback away before it is stored. A JSON Schema's own `pattern` keywords
run on RE2 too. Plain data in and out: no Django, no torch.
"""

import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema
import re2
from referencing.exceptions import Unresolvable

from messages.text import message_text
from training.chat import assistant_message_from_text, call_arguments

Message = dict[str, Any]

CHECK_KINDS = (
    "regex",
    "not_regex",
    "max_words",
    "calls_tool",
    "no_tool_call",
    "tool_argument",
    "max_tool_calls",
    "answers_after_tool_success",
)
MAX_PATTERN_LENGTH = 1000
MAX_SCHEMA_BYTES = 10_000
MAX_SCHEMA_DEPTH = 32
# RE2 compiles a pattern into an automaton within this memory or refuses it ("pattern too large"):
# `(a{1000}){1000}` is short to write and would otherwise cost hundreds of megabytes.
_OPTIONS = re2.Options()
_OPTIONS.max_mem = 8 << 20
_OPTIONS.log_errors = False  # a refused pattern is the caller's answer, not a log line


@dataclass(frozen=True)
class CheckResult:
    kind: str
    value: Any
    passed: bool


@lru_cache(maxsize=256)  # a check runs on every sampled revision and every evaluation reply
def compile_pattern(pattern: str) -> re2._Regexp:
    """The RE2 program for a pattern; raises re2.error naming what RE2 cannot run."""
    return re2.compile(pattern, options=_OPTIONS)


def _reason(error: re2.error) -> str:
    reason = error.args[0] if error.args else "refused"
    return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)


def _pattern_problem(pattern: Any, kind: str) -> str | None:
    if not isinstance(pattern, str) or not pattern:
        return f"a {kind} check needs a pattern string"
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"a pattern is at most {MAX_PATTERN_LENGTH} characters"
    try:
        compile_pattern(pattern)
    except re2.error as error:
        return (
            f"not a valid regular expression for RE2 ({_reason(error)}); checks run on "
            "RE2, which has no backreferences or lookarounds (write it without them)"
        )
    return None


def _tool_problem(tool: Any, kind: str, tool_names: Collection[str]) -> str | None:
    if not isinstance(tool, str) or not tool:
        return f"{kind} needs a tool name"
    if tool_names and tool not in tool_names:
        return f"{tool!r} is not a tool of this trace ({', '.join(sorted(tool_names))})"
    return None


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check_problem(kind: Any, value: Any, tool_names: Collection[str] = ()) -> str | None:
    """Why a check cannot be run as given (None when it can), as `field: reason` with the field
    under the check (`value`, `value.schema`, ...); `tool_names` of the trace, if any."""
    if kind not in CHECK_KINDS:
        return f"kind: {kind!r} is not one of {', '.join(CHECK_KINDS)}"
    if kind in ("regex", "not_regex"):
        problem = _pattern_problem(value, kind)
        return f"value: {problem}" if problem else None
    if kind == "max_words":
        return None if _is_count(value, 1) else "value: max_words needs a positive whole number"
    if kind == "calls_tool":
        problem = _tool_problem(value, kind, tool_names)
        return f"value: {problem}" if problem else None
    if kind in ("no_tool_call", "answers_after_tool_success"):
        return None if value is None or value is True else f"value: {kind} takes true (or null)"
    if not isinstance(value, dict):
        return f"value: {kind} needs an object ({_VALUE_SHAPES[kind]})"
    unknown = sorted(set(value) - _VALUE_KEYS[kind])
    if unknown:
        return f"value.{unknown[0]}: not a field of {kind} ({_VALUE_SHAPES[kind]})"
    if kind == "max_tool_calls":
        if "tool" in value:
            problem = _tool_problem(value["tool"], kind, tool_names)
            if problem:
                return f"value.tool: {problem}"
        if not _is_count(value.get("max"), 0):
            return "value.max: max_tool_calls needs a whole number of calls, 0 or more"
        return None
    problem = _tool_problem(value.get("tool"), kind, tool_names)
    if problem:
        return f"value.tool: {problem}"
    if "schema" in value:
        if "argument" in value or "pattern" in value:
            return f"value: {kind} takes argument and pattern, or schema ({_VALUE_SHAPES[kind]})"
        return _schema_problem(value["schema"])
    if not isinstance(value.get("argument"), str) or not value["argument"]:
        return f"value.argument: {kind} needs the argument's name, or a schema"
    problem = _pattern_problem(value.get("pattern"), kind)
    return f"value.pattern: {problem}" if problem else None


_VALUE_SHAPES = {
    "tool_argument": '{"tool", "argument", "pattern"} or {"tool", "schema"}',
    "max_tool_calls": '{"tool"?, "max"}',
}
_VALUE_KEYS = {
    "tool_argument": {"tool", "argument", "pattern", "schema"},
    "max_tool_calls": {"tool", "max"},
}


def _schema_problem(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return "value.schema: not a valid JSON Schema (it must be an object)"
    if _depth(schema) > MAX_SCHEMA_DEPTH:  # json and the validators recurse once per level
        return f"value.schema: a schema nests at most {MAX_SCHEMA_DEPTH} levels deep"
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        return f"value.schema: a schema is at most {MAX_SCHEMA_BYTES} bytes as JSON"
    if not isinstance(schema.get("$schema", ""), str):
        return "value.schema: not a valid JSON Schema ($schema must be a draft's URI)"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        at = "/".join(str(part) for part in error.absolute_path) or "(top)"
        return f"value.schema: not a valid JSON Schema ({error.message} at {at})"
    for reference in _schema_values(schema, ("$ref", "$dynamicRef")):
        if not reference.startswith("#"):
            return f"value.schema: {reference!r} points outside the schema (only #... references)"
    for pattern in _schema_values(schema, ("pattern",)):
        problem = _pattern_problem(pattern, "schema")
        if problem:
            return f"value.schema: a pattern in it is {problem}"
    try:  # references followed once: one to nowhere, or to itself without end, shows here
        _validator_for(json.dumps(schema, sort_keys=True)).is_valid({})
    except Unresolvable as error:
        return f"value.schema: a reference in it points to nothing ({str(error)[:200]})"
    except RecursionError:
        return "value.schema: it refers to itself without end"
    return None


def _depth(node: Any) -> int:
    """How many levels of objects and lists a JSON value nests (counted without recursing)."""
    depth, level = 0, [node]
    while level:
        depth += 1
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
    return depth


def _schema_values(node: Any, keywords: tuple[str, ...]) -> Iterator[str]:
    """The string values of those keywords anywhere in a schema; for `pattern`, the
    `patternProperties` keys too (every regular expression the schema holds)."""
    if isinstance(node, dict):
        for key, child in node.items():
            if key in keywords and isinstance(child, str):
                yield child
            elif key == "patternProperties" and "pattern" in keywords and isinstance(child, dict):
                yield from child
            yield from _schema_values(child, keywords)
    elif isinstance(node, list):
        for child in node:
            yield from _schema_values(child, keywords)


def _re2_pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not compile_pattern(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _re2_pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for name, value in instance.items():
            if compile_pattern(pattern).search(name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


@lru_cache(maxsize=64)
def _validator_for(schema_json: str) -> jsonschema.protocols.Validator:
    """A validator of the schema's draft whose regular expressions run on RE2."""
    schema = json.loads(schema_json)
    draft = jsonschema.validators.validator_for(schema)
    re2_draft = jsonschema.validators.extend(
        draft, {"pattern": _re2_pattern, "patternProperties": _re2_pattern_properties}
    )
    return re2_draft(schema)


def tool_result_failed(message: Message) -> bool:
    """Whether a tool result reports a failure: its content starts with "error" or "Error"
    (after leading white space), or is a JSON object with an "error" key."""
    text = message_text(message).lstrip()
    if text.startswith(("error", "Error")):
        return True
    if not text.startswith("{"):
        return False
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and "error" in parsed


def reply_message(reply: str | Message) -> Message:
    """The reply as an assistant message: text is read in the hermes format, and so is the
    content of a message that brings no `tool_calls` of its own."""
    if isinstance(reply, str):
        return assistant_message_from_text(reply)
    if not reply.get("tool_calls") and "<tool_call>" in message_text(reply):
        return assistant_message_from_text(message_text(reply))
    return reply


def check_reply(
    checks: Sequence[dict], reply: str | Message, *, context: Sequence[Message] = ()
) -> list[CheckResult]:
    """Each check (`{"kind", "value"}`) applied to a reply given the messages before it."""
    message = reply_message(reply)
    return evaluate_checks(
        checks,
        text=message_text(message),
        tool_calls=message.get("tool_calls") or (),
        context=context,
    )


def passes_every_check(
    checks: Sequence[dict], reply: str | Message, *, context: Sequence[Message] = ()
) -> bool:
    """Whether the reply passes each of the checks (no checks: it does)."""
    return all(result.passed for result in check_reply(checks, reply, context=context))


def evaluate_checks(
    checks: Sequence[dict],
    *,
    text: str,
    tool_calls: Sequence[dict] = (),
    context: Sequence[Message] = (),
) -> list[CheckResult]:
    """Each check applied to a turn's text and tool calls (OpenAI shape), given the messages
    before the turn."""
    calls = [(call["function"]["name"], call_arguments(call)) for call in tool_calls]
    results = []
    for check in checks:
        kind, value = check["kind"], check.get("value")
        if kind == "regex":
            passed = compile_pattern(value).search(text) is not None
        elif kind == "not_regex":
            passed = compile_pattern(value).search(text) is None
        elif kind == "max_words":
            passed = len(text.split()) <= value
        elif kind == "calls_tool":
            passed = any(name == value for name, _ in calls)
        elif kind == "no_tool_call":
            passed = not calls
        elif kind == "tool_argument":
            arguments = [args for name, args in calls if name == value["tool"]]
            passed = bool(arguments) and all(_argument_fits(args, value) for args in arguments)
        elif kind == "max_tool_calls":
            tool = value.get("tool")
            passed = sum(1 for name, _ in calls if tool in (None, name)) <= value["max"]
        elif kind == "answers_after_tool_success":
            results_before = [message for message in context if message.get("role") == "tool"]
            answers = bool(text.strip()) and not calls
            passed = not (answers and results_before and tool_result_failed(results_before[-1]))
        else:
            raise ValueError(f"unknown check kind {kind!r} (known: {', '.join(CHECK_KINDS)})")
        results.append(CheckResult(kind=kind, value=value, passed=passed))
    return results


def _argument_fits(arguments: dict, value: dict) -> bool:
    if "schema" in value:
        validator = _validator_for(json.dumps(value["schema"], sort_keys=True))
        try:
            return validator.is_valid(arguments)
        except (Unresolvable, RecursionError):  # a reference no arguments could ever fit
            return False
    argument = arguments.get(value["argument"])
    return (
        isinstance(argument, str) and compile_pattern(value["pattern"]).search(argument) is not None
    )
