"""The evaluation's greedy replies: in process, cut to each item's budget; on a model server,
with the in-process replies taking over when the server does not answer."""

import httpx
import pytest

from tests.fake_upstream import free_port
from training.chat import render_prompt
from training.config import TrainingConfig
from training.evaluation import compare_replies
from training.repliers import InProcessReplier, ServerReplier
from training.sampling import generate_replies
from training.trainer import add_lora

QUESTIONS = ["what is the capital of france ?", "what color is the sky ?", "say hello"]


@pytest.fixture
def model_and_tokenizer(make_tiny_llama, make_tiny_tokenizer):
    config = TrainingConfig(lora_r=4, lora_alpha=8, min_steps=1, save_every_steps=0)
    return add_lora(make_tiny_llama(), config), make_tiny_tokenizer()


def _prompts(tokenizer) -> list[list[int]]:
    return [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


def test_in_process_replies_are_cut_to_each_items_own_budget(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts, budgets = _prompts(tokenizer), [2, 7, 4]
    eos = tokenizer.eos_token_id

    replies = InProcessReplier(eos, batch_size=3).greedy_replies(
        model, prompts, budgets, adapter_on=True
    )

    alone = [
        generate_replies(model, [p], eos_token_id=eos, max_new_tokens=b, temperature=None)[0]
        for p, b in zip(prompts, budgets, strict=True)
    ]
    assert replies == alone
    assert [len(reply) for reply in replies] == [2, 7, 4]  # the random model never says eos


def test_a_server_that_does_not_answer_hands_every_reply_to_the_fallback(
    model_and_tokenizer, tmp_path
):
    model, tokenizer = model_and_tokenizer
    eos = tokenizer.eos_token_id
    items = [{"context": [{"role": "user", "content": q}]} for q in QUESTIONS]
    with httpx.Client(timeout=2) as client:
        replier = ServerReplier(
            client,
            f"http://127.0.0.1:{free_port()}/v1",  # nothing listens there
            base_model="base",
            scratch_dir=tmp_path / "scratch",
            eos_token_id=eos,
            fallback=InProcessReplier(eos),
        )
        on_server = compare_replies(model, tokenizer, items, max_new_tokens=4, replier=replier)

    in_process = compare_replies(model, tokenizer, items, max_new_tokens=4)
    assert on_server == in_process
    assert replier.record["server_replies"] == 0
    assert replier.record["in_process_replies"] == 2 * len(items)  # base side and adapter side
    assert replier.record["error"].startswith("ConnectError")
    assert not list((tmp_path / "scratch").glob("*"))  # no candidate left on disk
