"""The real bundled SmolLM2-135M-Instruct: converted from its GGUF once, then a normal HF model."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.base_models import resolve_base_model
from training.chat import render_prompt
from training.eval_sets import general_regression_items
from training.evaluation import checked_reply, generation_budget
from training.repliers import InProcessReplier

pytestmark = pytest.mark.slow

BUNDLED = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("base-models")


@pytest.fixture(scope="module")
def model_dir(cache_dir) -> Path:
    return resolve_base_model(BUNDLED, cache_dir)


def test_converted_model_answers_the_capital_of_france(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )

    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)

    assert "Paris" in reply


def test_second_resolve_reuses_the_converted_dir(model_dir, cache_dir):
    weights = model_dir / "model.safetensors"
    before = (model_dir.stat().st_ino, weights.stat().st_mtime_ns)

    assert resolve_base_model(BUNDLED, cache_dir) == model_dir
    assert (model_dir.stat().st_ino, weights.stat().st_mtime_ns) == before


def test_the_base_answers_every_general_fact_the_gate_asks(model_dir):
    """A fact the base gets wrong is noise in the gate: an adapter that happens to answer it
    makes the next candidate "break" it. Asked as the gate asks: its prompt, budget and replier."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    items = general_regression_items()
    prompts = [render_prompt(tokenizer, item["context"]) for item in items]
    budgets = [generation_budget(tokenizer, None) for _ in items]

    replies = InProcessReplier(tokenizer.eos_token_id).greedy_replies(
        model,
        prompts,
        budgets,
        adapter_on=True,  # a plain model: no adapter to turn off
    )

    wrong = {
        item["prompt"]: result["reply"]
        for item, reply in zip(items, replies, strict=True)
        if not (result := checked_reply(tokenizer, item, reply))["passed"]
    }
    assert wrong == {}
