"""Feedback checks: machine-checkable expectations on one reply, in time linear in the reply.

Patterns run on RE2 (google-re2), whose matching time grows with the text, never exponentially:
a catastrophic pattern such as `(a+)+$` cannot hold up the worker that runs it. RE2 refuses what
needs backtracking (backreferences, lookarounds); `check_problem` names it, so the API and the
dashboard turn such feedback away before it is stored. Plain data in and out: no Django, no torch.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2

CHECK_KINDS = ("regex", "not_regex", "max_words", "calls_tool")
MAX_PATTERN_LENGTH = 1000
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


def check_problem(kind: Any, value: Any, tool_names: Collection[str] = ()) -> str | None:
    """Why a check cannot be run as given (None when it can); `tool_names` of the trace, if any."""
    if kind not in CHECK_KINDS:
        return f"kind: {kind!r} is not one of {', '.join(CHECK_KINDS)}"
    if kind in ("regex", "not_regex"):
        if not isinstance(value, str) or not value:
            return f"value: a {kind} check needs a pattern string"
        if len(value) > MAX_PATTERN_LENGTH:
            return f"value: a pattern is at most {MAX_PATTERN_LENGTH} characters"
        try:
            compile_pattern(value)
        except re2.error as error:
            return (
                f"value: not a valid regular expression for RE2 ({_reason(error)}); checks run on "
                "RE2, which has no backreferences or lookarounds (write it without them)"
            )
    elif kind == "max_words":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return "value: max_words needs a positive whole number"
    elif kind == "calls_tool":
        if not isinstance(value, str) or not value:
            return "value: calls_tool needs a tool name"
        if tool_names and value not in tool_names:
            return f"value: {value!r} is not a tool of this trace ({', '.join(sorted(tool_names))})"
    return None


def evaluate_checks(
    checks: Sequence[dict], *, text: str, called_tools: Collection[str]
) -> list[CheckResult]:
    """Each check (`{"kind", "value"}`) applied to a reply's text and the tools it called."""
    results = []
    for check in checks:
        kind, value = check["kind"], check["value"]
        if kind == "regex":
            passed = compile_pattern(value).search(text) is not None
        elif kind == "not_regex":
            passed = compile_pattern(value).search(text) is None
        elif kind == "max_words":
            passed = len(text.split()) <= value
        elif kind == "calls_tool":
            passed = value in called_tools
        else:
            raise ValueError(f"unknown check kind {kind!r} (known: {', '.join(CHECK_KINDS)})")
        results.append(CheckResult(kind=kind, value=value, passed=passed))
    return results
