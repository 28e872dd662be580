"""The gate's checks see the episode up to the pinned turn: whether answering passes
`answers_after_tool_success` depends on the tool result before the turn."""

import json

from training.config import TrainingConfig
from training.evaluation import compare_replies
from training.trainer import Example, add_lora, train


def _episode(tool_result: str) -> list[dict]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "paris"})},
    }
    return [
        {"role": "user", "content": "what is the color of the sky in paris ?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": tool_result},
    ]


def test_an_answer_passes_after_a_good_tool_result_and_fails_after_an_error(
    make_tiny_llama, make_tiny_tokenizer
):
    tokenizer = make_tiny_tokenizer()
    config = TrainingConfig(
        lora_r=4, lora_alpha=8, learning_rate=3e-2, epochs=15, min_steps=1, save_every_steps=0
    )
    model = add_lora(make_tiny_llama(), config)
    contexts = [_episode("blue"), _episode("error : no")]
    answer = {"role": "assistant", "content": "blue"}
    train(model, tokenizer, config, examples=[Example(context, answer) for context in contexts])
    check = {"kind": "answers_after_tool_success", "value": True}
    items = [{"context": context, "checks": [check]} for context in contexts]

    after_success, after_error = compare_replies(model, tokenizer, items, max_new_tokens=4)

    assert after_success["after"]["reply"] == after_error["after"]["reply"] == "blue"
    assert after_success["after"]["passed"] is True
    assert after_error["after"]["passed"] is False
