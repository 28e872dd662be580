import json

import pytest

from tests.training.conftest import TOOL_CALLS_TEMPLATE
from training.chat import (
    assistant_message_from_text,
    build_example,
    render_prompt,
    template_renders_tool_calls,
    with_tool_calls_as_text,
)

CONTEXT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]
WEATHER_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
}


def _target_tokens(tokenizer, input_ids, loss_mask):
    return tokenizer.decode(
        [token for token, masked in zip(input_ids, loss_mask, strict=True) if masked]
    )


def test_prompt_is_the_rendered_chat_with_the_generation_prompt(make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()

    prompt = render_prompt(tokenizer, CONTEXT)

    expected_text = tokenizer.apply_chat_template(
        CONTEXT, tokenize=False, add_generation_prompt=True
    )
    assert prompt == tokenizer(expected_text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(prompt).endswith("<|im_start|> assistant ↵")


def test_loss_mask_covers_exactly_the_target_turn_and_its_end_token(make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()
    target = {"role": "assistant", "content": "Rome."}

    input_ids, loss_mask = build_example(tokenizer, CONTEXT, target)

    prompt = render_prompt(tokenizer, CONTEXT)
    assert input_ids[: len(prompt)] == prompt
    assert loss_mask == [0] * len(prompt) + [1] * (len(input_ids) - len(prompt))
    assert _target_tokens(tokenizer, input_ids, loss_mask) == "rome . <|im_end|>"


def test_text_after_the_end_of_turn_token_is_not_part_of_the_example(make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()  # the template writes a newline after <|im_end|>

    input_ids, _ = build_example(tokenizer, CONTEXT, {"role": "assistant", "content": "Rome."})

    assert input_ids[-1] == tokenizer.eos_token_id


def test_content_parts_render_like_a_string(make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]

    assert render_prompt(tokenizer, as_parts) == render_prompt(
        tokenizer, [{"role": "user", "content": "hello"}]
    )


def test_tool_calls_become_hermes_text_when_the_template_ignores_them(make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()
    target = {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]}

    input_ids, loss_mask = build_example(tokenizer, CONTEXT, target)

    assert not template_renders_tool_calls(tokenizer)
    target_text = _target_tokens(tokenizer, input_ids, loss_mask)
    assert "tool_call" in target_text
    assert "get_weather" in target_text
    assert "paris" in target_text


def test_tool_calls_are_rendered_by_a_template_that_knows_them(make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer(TOOL_CALLS_TEMPLATE)
    target = {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]}

    input_ids, loss_mask = build_example(tokenizer, CONTEXT, target)

    assert template_renders_tool_calls(tokenizer)
    assert _target_tokens(tokenizer, input_ids, loss_mask).startswith("call get_weather")


def test_hermes_text_round_trips_to_the_same_tool_call():
    message = {"role": "assistant", "content": "Checking.", "tool_calls": [WEATHER_CALL]}

    parsed = assistant_message_from_text(with_tool_calls_as_text(message)["content"])

    assert parsed["content"] == "Checking."
    assert [call["function"]["name"] for call in parsed["tool_calls"]] == ["get_weather"]
    assert json.loads(parsed["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


def test_plain_text_parses_to_a_message_without_tool_calls():
    assert assistant_message_from_text("  Paris. ") == {"role": "assistant", "content": "Paris."}


def test_a_target_that_is_not_an_assistant_turn_is_rejected(make_tiny_tokenizer):
    with pytest.raises(ValueError, match="assistant"):
        build_example(make_tiny_tokenizer(), CONTEXT, {"role": "user", "content": "hi"})
