"""The evaluation on a real vLLM CPU server: a trained candidate loaded under a temporary name
answers as the same adapter does in process, and is gone from the server afterwards."""

import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from training.base_models import resolve_base_model
from training.config import TrainingConfig
from training.eval_sets import general_regression_items
from training.evaluation import evaluate_adapter
from training.repliers import InProcessReplier, ServerReplier
from training.trainer import Example, add_lora, load_base_model, train

pytestmark = pytest.mark.slow
QUESTIONS = ["Who wrote Hamlet?", "What do bees make?", "Which planet is red?", "Say hello."]


def _replies(report: dict) -> list[tuple[str, str]]:
    rows = [*report["items"], *report["regression"]["items"]]
    return [(row["before"]["reply"], row["after"]["reply"]) for row in rows]


def test_a_candidate_answers_on_vllm_as_in_process_and_is_unloaded_after(vllm_url, tmp_path):
    model_dir = resolve_base_model(settings.BASE_MODEL, Path(settings.MODEL_CACHE_DIR))
    # A candidate that learned something visible ("Answer: " in front), in a few steps.
    config = TrainingConfig(learning_rate=1e-3, min_steps=6, base_kl_weight=0.0, save_every_steps=0)
    base, tokenizer = load_base_model(model_dir, config, device="cpu")
    model = add_lora(base, config)
    examples = [
        Example([{"role": "user", "content": q}], {"role": "assistant", "content": "Answer: yes."})
        for q in QUESTIONS
    ]
    train(model, tokenizer, config, examples=examples)
    feedback_items = [
        {
            "context": [{"role": "user", "content": q}],
            "checks": [{"kind": "regex", "value": "^Answer:"}],
        }
        for q in QUESTIONS
    ]
    regression_items = general_regression_items()
    eos = tokenizer.eos_token_id

    with httpx.Client(timeout=300) as client:
        server = ServerReplier(
            client,
            vllm_url,
            base_model=settings.BASE_MODEL,
            scratch_dir=tmp_path / "scratch",
            eos_token_id=eos,
            fallback=InProcessReplier(eos),
            name_prefix="eval-test",
        )
        started = time.monotonic()
        on_server = evaluate_adapter(
            model, tokenizer, feedback_items, regression_items, replier=server
        )
        evaluated_in = time.monotonic() - started
        served = {entry["id"] for entry in client.get(f"{vllm_url}/models").json()["data"]}
    in_process = evaluate_adapter(model, tokenizer, feedback_items, regression_items)

    assert server.record["error"] == ""
    assert server.record["server_replies"] == 2 * (len(feedback_items) + len(regression_items))
    assert 0 < server.record["reply_seconds"] <= evaluated_in
    spent = server.record["reply_seconds"]
    print(f"replies {spent:.1f} s of the evaluation's {evaluated_in:.1f} s")
    pairs = list(zip(_replies(on_server), _replies(in_process), strict=True))
    same_before = sum(server_side[0] == local[0] for server_side, local in pairs)
    same_after = sum(server_side[1] == local[1] for server_side, local in pairs)
    print(f"\nidentical replies of {len(pairs)}: base {same_before}, candidate {same_after}")
    assert same_before >= 0.8 * len(pairs)
    assert same_after >= 0.8 * len(pairs)
    assert on_server["feedback_items"]["fixed"] >= 1  # the candidate differs from the base
    # The temporary adapter is unloaded and its files are gone; only the base stays served.
    assert not any(name.startswith("eval-test") for name in served)
    assert not list((tmp_path / "scratch").glob("*"))
