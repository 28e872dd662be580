"""The real bundled SmolLM2-135M-Instruct: converted from its GGUF once, then a normal HF model."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.base_models import resolve_base_model
from training.eval_sets import general_regression_items
from training.evaluation import MIN_EVAL_TOKENS
from training.targets import run_checks

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
    makes the next candidate "break" it. The gate's budget for a fact is MIN_EVAL_TOKENS."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    wrong = {}
    for item in general_regression_items():
        prompt = tokenizer.apply_chat_template(
            item["context"], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            output = model.generate(**prompt, max_new_tokens=MIN_EVAL_TOKENS, do_sample=False)
        start = prompt["input_ids"].shape[1]
        reply = tokenizer.decode(output[0, start:], skip_special_tokens=True).strip()
        if not all(result.passed for result in run_checks(reply, item["checks"])):
            wrong[item["prompt"]] = reply

    assert wrong == {}
