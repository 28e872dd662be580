"""Per-trace facts the monitors aggregate: tool results and errors per tool, answers and their
length, replies cut at max_tokens.

Computed once from the messages when a trace is stored and kept as columns on `Trace`, so the
monitors and alerts are exact SQL over every trace instead of a sample of bodies. Every fact is a
count or a sum, so the facts of a conversation are the facts of its first part plus those of the
messages added after it: a recorder that appends messages calls `add_message_facts` with the new
messages only and never re-reads the body.

Answer length is counted in words over answers (assistant turns with text and no tool call):
`answer_words / answer_count` is the words-per-answer figure the length-drift alert compares,
and both sum over traces and over appended messages.

An answer written straight after a failed tool result (`answers_after_tool_error`) is one the
agent gave without the result it asked for: where it gives up on a flaky tool, or invents
what the tool would have said. An environment whose tools fail teaches it to do so.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from messages.text import content_text
from reviewapp.traces.rendering import looks_like_tool_error

UNKNOWN_TOOL = "unknown"  # a tool result whose call is not in the conversation


@dataclass(frozen=True)
class TraceFacts:
    tool_results: dict[str, int] = field(default_factory=dict)  # tool name -> results seen
    tool_errors: dict[str, int] = field(default_factory=dict)  # tool name -> error results
    answer_count: int = 0
    answer_words: int = 0
    truncated_replies: int = 0  # assistant replies cut at max_tokens
    answers_after_tool_error: int = 0  # answers whose message before is a failed tool result

    @property
    def tool_result_count(self) -> int:
        return sum(self.tool_results.values())

    @property
    def tool_error_count(self) -> int:
        return sum(self.tool_errors.values())

    def columns(self) -> dict[str, Any]:
        """The `Trace` column values, by field name."""
        return {
            "tool_results": self.tool_results,
            "tool_errors": self.tool_errors,
            "tool_result_count": self.tool_result_count,
            "tool_error_count": self.tool_error_count,
            "answer_count": self.answer_count,
            "answer_words": self.answer_words,
            "truncated_replies": self.truncated_replies,
            "answers_after_tool_error": self.answers_after_tool_error,
        }

    @classmethod
    def of_trace(cls, trace: Any) -> "TraceFacts":
        """The facts stored on a `Trace` row (or anything with its column attributes)."""
        return cls(
            tool_results=dict(trace.tool_results or {}),
            tool_errors=dict(trace.tool_errors or {}),
            answer_count=trace.answer_count,
            answer_words=trace.answer_words,
            truncated_replies=trace.truncated_replies,
            answers_after_tool_error=trace.answers_after_tool_error,
        )


# The `Trace` columns the facts fill, in the order columns() gives them.
FACT_COLUMNS = tuple(TraceFacts().columns())


def tool_call_names(messages: Iterable[Any]) -> dict[str, str]:
    """tool_call_id -> tool name, from the assistant messages' tool calls."""
    names: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            if not isinstance(call, Mapping):
                continue
            function = call.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            names[str(call.get("id", ""))] = str(name or UNKNOWN_TOOL)
    return names


def add_message_facts(
    facts: TraceFacts,
    new_messages: list[Any],
    *,
    earlier_messages: Iterable[Any] = (),
    truncated_replies: int = 0,
) -> TraceFacts:
    """`facts` plus those of `new_messages`, appended after the messages `facts` describes.

    A tool result names its call by id; the call may sit in an earlier message, so pass the
    earlier messages that hold the calls the new ones answer, up to the last one before them
    (from the last assistant message on is enough; the last of them tells whether the first new
    answer follows a failed tool result). `truncated_replies`: replies among the new ones the
    caller knows were cut at max_tokens (a recorder's finish_reason "length"); an assistant
    message that itself says `"finish_reason": "length"` counts too.
    """
    earlier = list(earlier_messages)
    names = tool_call_names(earlier)
    tool_results = dict(facts.tool_results)
    tool_errors = dict(facts.tool_errors)
    answer_count, answer_words = facts.answer_count, facts.answer_words
    after_error = facts.answers_after_tool_error
    cut_in_messages = 0
    # Whether the message before the one read is a failed tool result.
    follows_error = bool(earlier) and _is_tool_error(earlier[-1])
    for message in new_messages:
        if not isinstance(message, Mapping):
            follows_error = False
            continue
        role = message.get("role")
        failed = _is_tool_error(message)
        if role == "assistant":
            calls = message.get("tool_calls") or ()
            names.update(tool_call_names([message]))
            text = content_text(message.get("content")).strip()
            if text and not calls:
                answer_count += 1
                answer_words += len(text.split())
                after_error += follows_error
            if message.get("finish_reason") == "length":
                cut_in_messages += 1
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id", "")), UNKNOWN_TOOL)
            tool_results[name] = tool_results.get(name, 0) + 1
            if failed:
                tool_errors[name] = tool_errors.get(name, 0) + 1
        follows_error = failed
    return TraceFacts(
        tool_results=tool_results,
        tool_errors=tool_errors,
        answer_count=answer_count,
        answer_words=answer_words,
        truncated_replies=facts.truncated_replies + max(truncated_replies, cut_in_messages),
        answers_after_tool_error=after_error,
    )


def _is_tool_error(message: Any) -> bool:
    return (
        isinstance(message, Mapping)
        and message.get("role") == "tool"
        and looks_like_tool_error(content_text(message.get("content")))
    )


def facts_of(messages: list[Any], *, truncated: bool = False) -> TraceFacts:
    """The facts of a whole conversation (OpenAI chat messages as stored).

    `truncated`: the trace is known to have ended cut at max_tokens (termination `truncated`)
    though no message says which reply was cut; that counts as one cut reply.
    """
    return add_message_facts(TraceFacts(), messages, truncated_replies=int(truncated))
