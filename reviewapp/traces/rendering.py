"""Turning stored traces into what a reviewer reads. All trace text is untrusted.

Markdown is rendered with raw HTML disabled and then sanitised by nh3 with a small allowlist,
so nothing from a trace becomes a script, an event handler, an htmx attribute or a URL
other than http(s)/mailto.
"""

import json
import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from functools import cached_property

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

from messages.text import media_part_types, message_text

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")

ALLOWED_TAGS = {
    "p", "br", "strong", "em", "code", "pre", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "a", "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}}

TOOL_ERROR_PATTERN = re.compile(
    r"^\s*(error|exception|traceback)\b|timed out|timeout|\"error\"\s*:", re.IGNORECASE
)


def render_markdown(text: str) -> SafeString:
    html = _markdown.render(text)
    clean = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
    return mark_safe(clean)


def pretty_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return text


def looks_like_tool_error(text: str) -> bool:
    return bool(TOOL_ERROR_PATTERN.search(text[:500]))


@dataclass
class ToolCallView:
    id: str
    name: str
    arguments: str
    result: str | None = None
    result_index: int | None = None
    is_error: bool = False


@dataclass
class TurnView:
    index: int
    role: str
    text: str
    tool_calls: list[ToolCallView] = field(default_factory=list)
    # A tool message shown beside its call is not shown again on its own.
    shown_with_call: bool = False
    is_error: bool = False
    name: str = ""
    # The types of content parts with no text (an image, an audio clip), shown as labels.
    media: list[str] = field(default_factory=list)

    @cached_property
    def html(self) -> SafeString | None:
        """Assistant markdown, rendered only for the turns a page actually shows."""
        return render_markdown(self.text) if self.role == "assistant" and self.text else None


@dataclass
class ToolDefinitionView:
    name: str
    description: str
    parameters: str
    called: bool


def conversation(messages: list[dict]) -> list[TurnView]:
    """Messages as turns, each tool call paired with its result."""
    turns: list[TurnView] = []
    calls_by_id: dict[str, ToolCallView] = {}
    for index, message in enumerate(messages):
        role = message.get("role", "")
        text = message_text(message)
        turn = TurnView(
            index=index,
            role=role,
            text=text,
            name=message.get("name") or "",
            media=media_part_types(message.get("content")),
        )
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                view = ToolCallView(
                    id=call.get("id", ""),
                    name=function.get("name", ""),
                    arguments=pretty_json(function.get("arguments", "")),
                )
                calls_by_id[view.id] = view
                turn.tool_calls.append(view)
        elif role == "tool":
            call = calls_by_id.get(message.get("tool_call_id", ""))
            turn.is_error = looks_like_tool_error(text)
            if call is not None and call.result is None:
                call.result, call.result_index, call.is_error = text, index, turn.is_error
                turn.shown_with_call = True
        turns.append(turn)
    return turns


def tool_definitions(tools: list[dict], messages: list[dict]) -> list[ToolDefinitionView]:
    called = {
        (call.get("function") or {}).get("name")
        for message in messages
        for call in message.get("tool_calls") or ()
    }
    views = []
    for tool in tools:
        function = tool.get("function") or {}
        views.append(
            ToolDefinitionView(
                name=function.get("name", ""),
                description=function.get("description") or "",
                parameters=json.dumps(function.get("parameters") or {}, indent=2),
                called=function.get("name") in called,
            )
        )
    return views


# Words and the whitespace between them: a diff at this grain reads like an edit, and joining
# the pieces gives the text back exactly.
_DIFF_TOKENS = re.compile(r"\s+|\w+|[^\w\s]")


@dataclass(frozen=True)
class DiffPiece:
    op: str  # "equal", "insert" (only in the revision) or "delete" (only in the original)
    text: str


def word_diff(original: str, revised: str) -> list[DiffPiece]:
    """The revision against the original, word by word; plain text for the template to escape."""
    before, after = _DIFF_TOKENS.findall(original), _DIFF_TOKENS.findall(revised)
    pieces: list[DiffPiece] = []
    matcher = SequenceMatcher(None, before, after, autojunk=False)
    for op, start, end, new_start, new_end in matcher.get_opcodes():
        if op in ("delete", "replace"):
            pieces.append(DiffPiece("delete", "".join(before[start:end])))
        if op in ("insert", "replace"):
            pieces.append(DiffPiece("insert", "".join(after[new_start:new_end])))
        if op == "equal":
            pieces.append(DiffPiece("equal", "".join(before[start:end])))
    return pieces
