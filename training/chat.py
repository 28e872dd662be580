"""Chat rendering: conversations (OpenAI message dicts) to token ids, the way vLLM renders them.

vLLM's /v1/chat/completions renders the messages with the chat template
(`add_generation_prompt=True`) and tokenizes the text without adding special tokens; the model
then writes the assistant turn. Training on a turn must see the same ids, so this module
mirrors that: the content becomes its text by vLLM's rule (`messages.text`), and tool call
arguments are parsed from JSON into dicts before the template sees them.

The template: the tokenizer's own, except where `chat_template_for` replaces it. The bundled
SmolLM2's own template drops tool definitions and tool calls, so the model would never see its
own earlier calls; it is rendered with `TOOL_CHAT_TEMPLATE` instead (hermes style, the same text
for plain conversations), and vLLM serves it with the same file (`training.vllm_server`).

vLLM leaves the tool definitions out of a prompt whose request says tool_choice "none"
(`--exclude-tools-when-tool-choice-none`): callers pass the tools a turn's prompt showed (the
product records them per turn), not a trace's whole list, so a turn is trained and judged on the
ids it was served with.

Tool calls in a target turn: a template that renders `tool_calls` is used as is. A template that
ignores them would train the student on an empty turn, so the calls are written as hermes text
(`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), which is what vLLM's hermes tool
parser (`--tool-call-parser hermes`) turns back into `tool_calls` when the model writes it.
Context turns are left as the server rendered them.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from messages.text import message_text

if TYPE_CHECKING:  # the checks import the hermes parser here; the web process loads no torch
    from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# A tool name no real template prints unless it renders the tool calls it is given.
_PROBE_TOOL_NAME = "probe_tool_7f3a"

# Package data (pyproject's [tool.setuptools.package-data]): the one file trainer and server use.
TOOL_CHAT_TEMPLATE = files("training") / "smollm2_tools.jinja"
# SHA-256 of SmolLM2-135M-Instruct's own template (ChatML, tools ignored), as the bundled model's
# conversion writes it: a tokenizer with exactly that template is rendered with ours instead.
_REPLACED_TEMPLATES = {"872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788"}


def chat_template_for(own_template: str | None) -> str | None:
    """The template that renders in place of a model's own one, or None to keep its own."""
    if not isinstance(own_template, str):  # none, or a tokenizer's set of named templates
        return None
    if hashlib.sha256(own_template.encode()).hexdigest() in _REPLACED_TEMPLATES:
        return tool_chat_template()
    return None


@lru_cache(maxsize=1)
def tool_chat_template() -> str:
    """The text of `TOOL_CHAT_TEMPLATE`."""
    return TOOL_CHAT_TEMPLATE.read_text()


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict] | None = None
) -> list[int]:
    """The prompt token ids the server sends to the model for these messages."""
    return _encode(tokenizer, _render_text(tokenizer, messages, tools, add_generation_prompt=True))


def build_example(
    tokenizer: PreTrainedTokenizerBase,
    context_messages: list[Message],
    target_message: Message,
    tools: list[dict] | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) for training `target_message` as the reply to the context.

    The prompt part is exactly `render_prompt(context)`; the mask covers the target turn's tokens
    up to and including the end-of-turn token (the tokenizer's eos), nothing of the context.
    """
    if target_message.get("role") != "assistant":
        raise ValueError(f"the target must be an assistant message, not {target_message!r}")
    if target_message.get("tool_calls") and not template_renders_tool_calls(tokenizer):
        target_message = with_tool_calls_as_text(target_message)

    prompt_text = _render_text(tokenizer, context_messages, tools, add_generation_prompt=True)
    full_text = _render_text(
        tokenizer, [*context_messages, target_message], tools, add_generation_prompt=False
    )
    if not full_text.startswith(prompt_text):
        raise ValueError("the chat template renders the context differently once a reply follows")
    prompt_ids = _encode(tokenizer, prompt_text)
    # Encoded on its own, as the model writes it after the prompt: no merges across the seam.
    target_ids = _encode(tokenizer, full_text[len(prompt_text) :])
    # What follows the end-of-turn token (a newline between turns) is never generated.
    if tokenizer.eos_token_id in target_ids:
        target_ids = target_ids[: target_ids.index(tokenizer.eos_token_id) + 1]
    return prompt_ids + target_ids, [0] * len(prompt_ids) + [1] * len(target_ids)


def template_renders_tool_calls(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template prints an assistant message's `tool_calls`."""
    probe_call = {"type": "function", "function": {"name": _PROBE_TOOL_NAME, "arguments": "{}"}}
    probe = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [probe_call]},
    ]
    try:
        text = _render_text(tokenizer, probe, None, add_generation_prompt=False)
    except Exception:  # a template that cannot render tool calls at all
        return False
    return _PROBE_TOOL_NAME in text


def with_tool_calls_as_text(message: Message) -> Message:
    """The assistant message with its tool calls appended to the content as hermes text."""
    blocks = [
        "<tool_call>\n"
        + json.dumps({"name": call["function"]["name"], "arguments": call_arguments(call)})
        + "\n</tool_call>"
        for call in message.get("tool_calls") or []
    ]
    content = message_text(message)
    return {"role": "assistant", "content": "\n".join([content, *blocks] if content else blocks)}


def assistant_message_from_text(text: str) -> Message:
    """An assistant message (OpenAI shape) from generated text, hermes tool calls parsed out."""
    tool_calls = []
    for index, block in enumerate(_TOOL_CALL_BLOCK.findall(text)):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            continue  # left in the content, where a check or a reviewer will see it
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        tool_calls.append(
            {
                "id": f"call_{index}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call.get("arguments", {})),
                },
            }
        )
    content = _TOOL_CALL_BLOCK.sub("", text).strip() if tool_calls else text.strip()
    message: Message = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _render_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict] | None,
    *,
    add_generation_prompt: bool,
) -> str:
    return tokenizer.apply_chat_template(
        [_as_served(message) for message in messages],
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        chat_template=chat_template_for(tokenizer.chat_template),
    )


def _as_served(message: Message) -> Message:
    """The message as vLLM hands it to the template (see the module docstring)."""
    served = {**message, "content": message_text(message)}
    if message.get("tool_calls"):
        served["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": call_arguments(call)}}
            for call in message["tool_calls"]
        ]
    return served


def call_arguments(call: dict) -> Any:
    """A tool call's arguments as a dict; vLLM coerces malformed JSON to {} the same way."""
    arguments = call["function"].get("arguments")
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]
