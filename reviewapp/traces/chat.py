"""The Trace item of the ingest API: OpenAI chat messages, validated so a user can act on the error.

Every rejection names the field it is about (`messages[3].tool_calls[0].function.arguments: ...`).
"""

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from messages.text import message_text
from reviewapp.api.errors import field_path
from reviewapp.traces.models import Termination

Role = Literal["system", "developer", "user", "assistant", "tool"]


class IngestError(ValueError):
    """An item that cannot be stored; the message names the field and the problem."""


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: StrictStr = Field(min_length=1, max_length=200)
    arguments: StrictStr

    @field_validator("arguments")
    @classmethod
    def arguments_are_json(cls, arguments: str) -> str:
        try:
            json.loads(arguments)
        except ValueError as error:
            raise ValueError(
                f"must be a JSON-encoded string; it does not parse ({error})"
            ) from None
        return arguments


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: StrictStr = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: StrictStr = Field(min_length=1)


class Message(BaseModel):
    # Providers add fields (refusal, reasoning_content, annotations): they are kept as sent.
    model_config = ConfigDict(extra="allow")

    role: Role
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None

    @model_validator(mode="after")
    def fields_fit_the_role(self) -> "Message":
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed on assistant messages, not {self.role}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.role in ("system", "developer", "user", "tool") and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self


class Outcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reward: float | None = Field(default=None, allow_inf_nan=False)
    success: bool | None = None


class Usage(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: StrictStr = Field(min_length=1, max_length=200)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: ToolFunction


class TraceItem(BaseModel):
    """One trace as the API receives it (see the public contract in the README)."""

    model_config = ConfigDict(extra="ignore")

    external_id: StrictStr = Field(min_length=1, max_length=256)
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDefinition] = Field(default_factory=list)
    model: StrictStr | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    termination: Termination = Termination.UNKNOWN
    outcome: Outcome | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    tags: list[StrictStr] = Field(default_factory=list, max_length=50)
    usage: Usage | None = None

    @field_validator("external_id")
    @classmethod
    def external_id_fits_a_url(cls, external_id: str) -> str:
        if "/" in external_id or external_id != external_id.strip():
            raise ValueError("must not contain '/' or leading/trailing whitespace")
        if any(ord(character) < 32 for character in external_id):
            raise ValueError("must not contain control characters")
        return external_id

    @field_validator("tags")
    @classmethod
    def tags_are_names(cls, tags: list[str]) -> list[str]:
        for tag in tags:
            if not tag.strip() or len(tag) > 100:
                raise ValueError(f"tag {tag[:40]!r} must be 1-100 characters")
        return list(dict.fromkeys(tag.strip() for tag in tags))

    @field_validator("started_at", "ended_at")
    @classmethod
    def times_are_utc(cls, moment: datetime | None) -> datetime | None:
        if moment is not None and moment.tzinfo is None:
            return moment.replace(tzinfo=UTC)
        return moment

    @model_validator(mode="after")
    def conversation_is_consistent(self) -> "TraceItem":
        if self.started_at and self.ended_at and self.ended_at < self.started_at:
            raise ValueError("ended_at is before started_at")
        tool_names = [tool.function.name for tool in self.tools]
        if len(set(tool_names)) != len(tool_names):
            raise ValueError("tools: two tool definitions share a name")
        seen_call_ids: set[str] = set()
        for index, message in enumerate(self.messages):
            for call in message.tool_calls or ():
                seen_call_ids.add(call.id)
            if message.role == "tool" and message.tool_call_id not in seen_call_ids:
                raise ValueError(
                    f"messages[{index}].tool_call_id: {message.tool_call_id!r} matches no tool "
                    "call in an earlier assistant message"
                )
        return self


def describe_validation_error(error: ValidationError) -> str:
    """The first few problems of a pydantic error, each led by the field it is about."""
    problems = []
    for detail in error.errors(include_url=False)[:3]:
        message = detail["msg"].removeprefix("Value error, ")
        if detail["type"] in ("literal_error", "enum"):
            message += f" (got {str(detail['input'])[:60]!r})"
        path = field_path(detail["loc"])
        problems.append(f"{path}: {message}" if path else message)
    more = error.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def text_problem(value: Any, *, max_depth: int) -> str | None:
    """Find text PostgreSQL can't store or nesting past the limit; return where, or None."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > max_depth:
            return f"{path or 'item'}: nested deeper than {max_depth} levels"
        if isinstance(node, str):
            if "\x00" in node:
                return f"{path}: contains a NUL character (\\u0000), which cannot be stored"
        elif isinstance(node, dict):
            for key, child in node.items():
                if "\x00" in key:
                    return f"{path}: a key contains a NUL character (\\u0000)"
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(node, list):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node))
    return None


def parse_trace_item(raw: Any, *, max_depth: int, max_messages: int) -> TraceItem:
    """Validate one raw item; raise IngestError naming the field on any problem."""
    if not isinstance(raw, dict):
        raise IngestError(f"each trace must be a JSON object, not {type(raw).__name__}")
    problem = text_problem(raw, max_depth=max_depth)
    if problem:
        raise IngestError(problem)
    messages = raw.get("messages")
    if isinstance(messages, list) and len(messages) > max_messages:
        raise IngestError(f"messages: {len(messages)} messages is over the limit of {max_messages}")
    try:
        return TraceItem.model_validate(raw)
    except ValidationError as error:
        raise IngestError(describe_validation_error(error)) from None


def unknown_fields(raw: dict) -> list[str]:
    return sorted(set(raw) - set(TraceItem.model_fields))


def preview_text(messages: list[dict]) -> str:
    """The first user message's text, for lists."""
    for message in messages:
        if message.get("role") == "user":
            return message_text(message)[:300]
    return ""
