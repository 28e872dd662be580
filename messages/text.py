"""A chat message's content as text: the one rule for what a reviewer reads, what a check tests,
what a preview shows and what the model is trained on.

The rule is vLLM's for a text model (its chat parser with the "string" content format), so the
text anyone looks at is the text the model saw: a string is the text; in a list of content parts,
plain strings and the text-like parts are joined with newlines, empty ones skipped; media parts
(images, audio, files) have no text and add nothing; None is "". Tool calls are not content:
they stay in `tool_calls`, where the reviewer sees them and the `calls_tool` check reads them.

Plain Python on purpose: the web process imports it, so nothing heavy comes with it.
"""

import json
from collections.abc import Mapping
from typing import Any

# Text-like content part types -> the key that holds the part's text.
TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}


def content_text(content: Any) -> str:
    """A message's `content` as the model reads it (see the module docstring)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        # Not OpenAI content (only an unvalidated gateway request holds such a thing): as JSON,
        # so a reviewer sees what was sent.
        return json.dumps(content, ensure_ascii=False)
    return "\n".join(text for part in content if (text := _part_text(part)))


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message's content (its tool calls are not content)."""
    return content_text(message.get("content"))


def media_part_types(content: Any) -> list[str]:
    """The types of the content parts that have no text (an image, an audio clip), in order."""
    if not isinstance(content, list):
        return []
    return [
        part_type if isinstance(part_type := part.get("type"), str) and part_type else "part"
        for part in content
        if isinstance(part, dict) and _text_key(part) is None
    ]


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return ""
    key = _text_key(part)
    text = part.get(key) if key else None
    return text if isinstance(text, str) else ""


def _text_key(part: dict) -> str | None:
    part_type = part.get("type")
    return TEXT_PART_KEYS.get(part_type) if isinstance(part_type, str) else None
