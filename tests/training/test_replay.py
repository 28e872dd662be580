"""The forgetting guard's tool episodes: the base's answer after a successful tool result."""

from training.checks import tool_result_failed
from training.eval_sets import TOOL_REPLAY_EPISODES
from training.replay import base_tool_replay_examples


def test_each_tool_episode_replays_the_turn_after_a_successful_result_of_an_offered_tool(
    tmp_path, make_tiny_llama, make_tiny_tokenizer
):
    model, tokenizer = make_tiny_llama(), make_tiny_tokenizer()

    examples = base_tool_replay_examples(model, tokenizer, cache_dir=tmp_path)

    assert 0 < len(examples) <= len(TOOL_REPLAY_EPISODES)
    for example in examples:
        *_, call, result = example.context
        [called] = call["tool_calls"]
        assert result["role"] == "tool" and not tool_result_failed(result)
        assert called["function"]["name"] in {tool["function"]["name"] for tool in example.tools}
        assert example.reply["role"] == "assistant"


def test_the_base_answers_are_generated_once_and_read_back(
    tmp_path, make_tiny_llama, make_tiny_tokenizer
):
    tokenizer = make_tiny_tokenizer()
    first = base_tool_replay_examples(make_tiny_llama(seed=0), tokenizer, cache_dir=tmp_path)

    # Another model under the same name and config: the cache answers, not the model.
    again = base_tool_replay_examples(make_tiny_llama(seed=1), tokenizer, cache_dir=tmp_path)

    assert [example.reply for example in again] == [example.reply for example in first]
