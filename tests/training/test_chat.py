import json

import pytest

from tests.training.conftest import TOOL_CALLS_TEMPLATE
from training.chat import (
    assistant_message_from_text,
    build_example,
    chat_template_for,
    render_prompt,
    template_renders_tool_calls,
    tool_chat_template,
    with_tool_calls_as_text,
)

# SmolLM2-135M-Instruct's own template, as the bundled model's conversion writes it.
SMOLLM2_OWN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
CALCULATOR_CALL = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "calculator", "arguments": json.dumps({"expression": "6*7"})},
}
TOOL_EPISODE = [
    {"role": "user", "content": "What is 6*7?"},
    {"role": "assistant", "content": "Let me compute it.", "tool_calls": [CALCULATOR_CALL]},
    {"role": "tool", "tool_call_id": "call_7", "content": "42"},
    {"role": "assistant", "content": "6*7 is 42."},
]

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


def _rendered(tokenizer, messages, tools=None, *, add_generation_prompt=False, template=None):
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=template or tool_chat_template(),
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def test_the_bundled_model_own_template_is_replaced_by_the_tool_template():
    assert chat_template_for(SMOLLM2_OWN_TEMPLATE) == tool_chat_template()
    assert chat_template_for(TOOL_CALLS_TEMPLATE) is None
    assert chat_template_for(None) is None


@pytest.mark.parametrize(
    "conversation",
    [
        [{"role": "user", "content": "hi"}],
        CONTEXT,
        [CONTEXT[1], CONTEXT[2], CONTEXT[3], {"role": "assistant", "content": "Rome."}],
    ],
)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_plain_conversation_renders_as_the_model_own_template_does(
    make_tiny_tokenizer, conversation, add_generation_prompt
):
    tokenizer = make_tiny_tokenizer()
    kwargs = {"add_generation_prompt": add_generation_prompt}

    ours = _rendered(tokenizer, conversation, **kwargs)

    assert ours == _rendered(tokenizer, conversation, template=SMOLLM2_OWN_TEMPLATE, **kwargs)


def test_tools_calls_and_results_appear_in_the_rendered_episode(make_tiny_tokenizer):
    text = _rendered(make_tiny_tokenizer(), TOOL_EPISODE, [CALCULATOR])

    assert "<tools>\n" + json.dumps(CALCULATOR) + "\n</tools>" in text
    assert (
        "<|im_start|>assistant\nLet me compute it.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
    ) in text
    assert "<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n6*7 is 42.<|im_end|>\n")


def test_results_of_parallel_calls_share_one_tool_turn(make_tiny_tokenizer):
    episode = [
        *TOOL_EPISODE[:2],
        {"role": "tool", "tool_call_id": "call_7", "content": "42"},
        {"role": "tool", "tool_call_id": "call_8", "content": "Error: timed out"},
    ]

    text = _rendered(make_tiny_tokenizer(), episode, add_generation_prompt=True)

    assert text.endswith(
        "<|im_start|>tool\n<tool_response>\n42\n</tool_response>\n<tool_response>\n"
        "Error: timed out\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_rendered_tool_call_turn_parses_back_to_the_same_call(make_tiny_tokenizer):
    text = _rendered(make_tiny_tokenizer(), TOOL_EPISODE[:2])
    assistant_turn = text.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")

    parsed = assistant_message_from_text(assistant_turn)

    assert parsed["content"] == "Let me compute it."
    [call] = parsed["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "6*7"}


def test_the_trainer_renders_the_bundled_model_with_the_tool_template(make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer(SMOLLM2_OWN_TEMPLATE)
    target = {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]}

    input_ids, loss_mask = build_example(tokenizer, CONTEXT, target)

    assert template_renders_tool_calls(tokenizer)
    expected = _rendered(tokenizer, [*CONTEXT, target]).removesuffix("\n")
    assert input_ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
    target_text = _target_tokens(tokenizer, input_ids, loss_mask)
    assert "tool_call" in target_text and "get_weather" in target_text
