"""The trace API's shapes beyond ingest: a trace with what review and learning hold about it,
feedback and outcomes written onto it (they are also the OpenAPI document)."""

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema

from reviewapp.review.feedback import MAX_CORRECTION_BYTES, MAX_FEEDBACK_TEXT_LENGTH
from reviewapp.traces.models import Termination, TraceSource


class OutcomeOut(Schema):
    reward: float | None
    success: bool | None


class TraceSummaryOut(Schema):
    external_id: str
    source: TraceSource
    model: str
    adapter_version: str
    termination: Termination
    outcome: OutcomeOut
    message_count: int
    tool_call_count: int
    preview: str
    tags: list[str]
    feedback_count: int
    started_at: datetime | None
    ended_at: datetime | None
    received_at: datetime


class TraceListOut(Schema):
    traces: list[TraceSummaryOut]
    next: str | None


class KeySourceOut(Schema):
    """Sent over the API with this key; the feedback's `author` is only what the key claimed."""

    kind: Literal["api_key"]
    name: str = Field(..., description="the key's name on the API keys page; empty if none")
    prefix: str = Field(..., description="the key's first characters, as the API keys page shows")


class PersonSourceOut(Schema):
    """Written by this person, signed in to the dashboard."""

    kind: Literal["person"]
    username: str


class UnknownSourceOut(Schema):
    """Its key or person is no longer stored (deleted, or written before keys were recorded)."""

    kind: Literal["unknown"]


FeedbackSourceOut = Annotated[
    KeySourceOut | PersonSourceOut | UnknownSourceOut, Field(discriminator="kind")
]


class FeedbackOut(Schema):
    id: int
    turn: int | None
    tool_call_id: str | None
    author: str = Field(
        ..., description="who wrote it, as its sender claimed; `source` says who sent it"
    )
    text: str
    rating: float | None
    correction: dict[str, Any] | None
    checks: list[dict[str, Any]]
    status: str
    # False: sent by a key without the review scope, so its targets wait for a reviewer
    from_reviewer: bool
    api_key: str | None  # the prefix of the key that sent it; `author` is what that key claimed
    source: FeedbackSourceOut = Field(
        ...,
        description="who sent it: an API key (`api_key`, with the key's name and prefix), a "
        "person in the dashboard (`person`, with the username), or `unknown` when neither is "
        "stored any more",
    )
    created_at: datetime


class ReviewedFeedbackOut(FeedbackOut):
    adapters: list[str]  # the adapter versions that learned from it, oldest first


class ReviewStateOut(Schema):
    tags: list[str]
    feedback: list[ReviewedFeedbackOut]
    reviewed: bool


class UsageOut(Schema):
    prompt_tokens: int | None
    completion_tokens: int | None


class TraceOut(Schema):
    external_id: str
    source: TraceSource
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    model: str | None
    adapter_version: str | None
    metadata: dict[str, Any]
    termination: Termination
    outcome: OutcomeOut
    started_at: datetime | None
    ended_at: datetime | None
    received_at: datetime
    usage: UsageOut
    tags: list[str]
    review: ReviewStateOut


class CheckIn(Schema):
    kind: str = Field(
        ...,
        description="regex | not_regex | max_words | calls_tool | no_tool_call | tool_argument | "
        "max_tool_calls | answers_after_tool_success; patterns are RE2 syntax (no "
        "backreferences or lookarounds)",
    )
    value: Any = Field(
        None,
        description='a pattern, a word count or a tool name; tool_argument: {"tool", "argument", '
        '"pattern"} or {"tool", "schema"} (a JSON Schema for the arguments); max_tool_calls: '
        '{"tool"?, "max"}; no_tool_call and answers_after_tool_success: true',
    )


class FeedbackIn(Schema):
    text: str = Field(..., min_length=1, max_length=MAX_FEEDBACK_TEXT_LENGTH)
    turn: int | None = Field(
        None, ge=0, description="0-based index in messages of the assistant turn; absent: trace"
    )
    tool_call_id: str | None = Field(None, max_length=200, description="pin to one tool call")
    rating: float | None = Field(None, ge=-1000, le=1000, allow_inf_nan=False)
    author: str | None = Field(None, max_length=200)
    correction: dict[str, Any] | None = Field(
        None,
        description=f"a corrected assistant message, at most {MAX_CORRECTION_BYTES} bytes as JSON",
    )
    checks: list[CheckIn] = Field(default_factory=list, max_length=20)


class OutcomeIn(Schema):
    reward: float | None = Field(None, allow_inf_nan=False)
    success: bool | None = None
    termination: Termination | None = None
