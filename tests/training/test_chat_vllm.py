"""The trainer's token ids of a recorded tool episode are the ids vLLM serves: the real vLLM CPU
server started with the product's command (its chat template and hermes tool parser flags)."""

import json
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from transformers import AutoTokenizer

from training.base_models import resolve_base_model
from training.chat import build_example, render_prompt

pytestmark = pytest.mark.slow

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Find the handbook document about a topic.",
        "parameters": {
            "type": "object",
            "properties": {"topic": {"type": "string", "description": "what to look up"}},
            "required": ["topic"],
        },
    },
}
# user, assistant tool call, tool result, assistant answer: as the gateway records an episode.
EPISODE = [
    {"role": "system", "content": "Answer from the handbook. Use the tools."},
    {"role": "user", "content": "How many vacation days do new staff get?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"topic": "vacation"})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "New staff get 25 days a year."},
    {"role": "assistant", "content": "New staff get 25 vacation days a year."},
]


@pytest.fixture(scope="module")
def tokenizer():
    model_dir = resolve_base_model(settings.BASE_MODEL, Path(settings.MODEL_CACHE_DIR))
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def _served_prompt_ids(vllm_url: str, messages: list[dict], **request) -> list[int]:
    response = httpx.post(
        f"{vllm_url}/chat/completions",
        json={
            "model": settings.BASE_MODEL,
            "messages": messages,
            "tools": [LOOKUP],
            "max_tokens": 1,
            "return_token_ids": True,
            **request,
        },
        timeout=120,
    )
    response.raise_for_status()
    return response.json()["prompt_token_ids"]


@pytest.mark.parametrize(
    "up_to",
    [
        pytest.param(4, id="before the answer"),
        pytest.param(5, id="the whole episode, then a new question"),
    ],
)
def test_a_tool_episode_has_the_same_ids_in_training_and_serving(vllm_url, tokenizer, up_to):
    messages = [*EPISODE[:up_to]]
    if up_to == len(EPISODE):
        messages.append({"role": "user", "content": "And for part-time staff?"})

    served = _served_prompt_ids(vllm_url, messages)

    assert served == render_prompt(tokenizer, messages, [LOOKUP])
    text = tokenizer.decode(served)
    assert '<tool_call>\n{"name": "lookup", "arguments": {"topic": "vacation"}}' in text
    assert "<tool_response>\nNew staff get 25 days a year.\n</tool_response>" in text


def test_a_trained_tool_call_turn_is_the_turn_the_server_renders(vllm_url, tokenizer):
    input_ids, loss_mask = build_example(tokenizer, EPISODE[:2], EPISODE[2], [LOOKUP])

    served = _served_prompt_ids(vllm_url, EPISODE[:4])

    assert served[: len(input_ids)] == input_ids
    trained = tokenizer.decode([t for t, m in zip(input_ids, loss_mask, strict=True) if m])
    assert trained.startswith("<tool_call>\n") and trained.endswith("</tool_call><|im_end|>")


def test_an_answer_asked_for_without_tools_is_prompted_without_their_definitions(
    vllm_url, tokenizer
):
    served = _served_prompt_ids(vllm_url, EPISODE[:4], tool_choice="none")

    assert served == render_prompt(tokenizer, EPISODE[:4], None)
    text = tokenizer.decode(served)
    assert "<tools>" not in text and '"name": "lookup", "arguments"' in text  # its call stays
