"""The real bundled SmolLM2-135M learns written feedback: targets from the model itself shown
the feedback (`hint`), SFT of a LoRA adapter on them, then held-out prompts WITHOUT feedback.

Measured on 2 CPU cores (numbers in the assertions' comments); about 1.5 min. "Always begin
your answer with 'Answer:'", held-out facts kept, is taught by tests/e2e/test_full_loop.py on the
worker's own path with default settings; this one teaches a length lesson with the library alone.
"""

import time

import pytest

from training.config import TrainingConfig
from training.evaluation import compare_replies
from training.targets import TransformersTeacher, propose_targets
from training.trainer import Example, add_lora, load_base_model, train

pytestmark = pytest.mark.slow

OPEN_QUESTIONS = [
    "Why is the sky blue?",
    "Tell me about the Eiffel Tower.",
    "How do airplanes fly?",
    "What is photosynthesis?",
    "Describe the water cycle.",
    "Why do we have seasons?",
    "What causes earthquakes?",
    "How does a rainbow form?",
    "What is electricity?",
    "How do plants grow?",
]
HELD_OUT_OPEN_QUESTIONS = [
    "Why do leaves change color in autumn?",
    "Tell me about the Great Wall of China.",
    "How do bees make honey?",
    "What is gravity?",
    "Describe how volcanoes erupt.",
    "Why is the ocean salty?",
    "How does the heart pump blood?",
    "What is the capital of France?",
]
MAX_TOKENS = 40
CONFIG = TrainingConfig(
    lora_r=16, lora_alpha=32, learning_rate=1e-3, epochs=6, min_steps=1, save_every_steps=0
)


def _user(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def _learn(model_dir, feedback: str, checks: list[dict], questions: list[str], config):
    """Propose targets with the base model as teacher, keep those passing the checks, train."""
    model, tokenizer = load_base_model(model_dir, config)
    teacher = TransformersTeacher(model, tokenizer, seed=0)
    started = time.monotonic()
    examples = []
    for question in questions:
        # The flagged reply: under the hint prompt the teacher never sees it.
        trace = [*_user(question), {"role": "assistant", "content": "(the flagged reply)"}]
        for proposal in propose_targets(
            teacher, trace, 1, feedback, checks, prompt="hint", n=4, max_tokens=MAX_TOKENS
        ):
            if proposal.passes_checks:
                examples.append(Example(_user(question), proposal.message))
    proposing_s = time.monotonic() - started
    student = add_lora(model, config)
    result = train(student, tokenizer, config, examples=examples)
    print(
        f"\n{feedback!r}: {len(examples)} targets from {len(questions)} prompts "
        f"in {proposing_s:.0f} s; "
        f"{result.steps} steps, {result.tokens} tokens in {result.seconds:.0f} s "
        f"({result.tokens / result.seconds:.0f} tokens/s)"
    )
    return student, tokenizer


def _compare(model, tokenizer, questions: list[str], checks: list[dict]) -> list[dict]:
    items = [{"context": _user(question), "checks": checks} for question in questions]
    started = time.monotonic()
    results = compare_replies(model, tokenizer, items, max_new_tokens=MAX_TOKENS)
    print(f"before/after replies in {time.monotonic() - started:.0f} s")
    for question, result in zip(questions, results, strict=True):
        print(f"{result['status']:>13} | {question}")
        print(f"{'':>13} | before: {result['before']['reply']!r}")
        print(f"{'':>13} | after:  {result['after']['reply']!r}")
    return results


def test_answer_briefly_is_learned_for_new_prompts(bundled_model_dir):
    feedback = "Answer in at most 12 words."
    checks = [{"kind": "max_words", "value": 12}]
    student, tokenizer = _learn(bundled_model_dir, feedback, checks, OPEN_QUESTIONS, CONFIG)

    results = _compare(student, tokenizer, HELD_OUT_OPEN_QUESTIONS, checks)

    before = sum(result["before"]["passed"] for result in results)
    after = sum(result["after"]["passed"] for result in results)
    words_before = sum(len(result["before"]["reply"].split()) for result in results) / 8
    words_after = sum(len(result["after"]["reply"].split()) for result in results) / 8
    print(f"at most 12 words on held-out prompts: base {before}/8, student {after}/8")
    print(f"mean words per reply: base {words_before:.1f}, student {words_after:.1f}")
    # Measured: base 1/8, student 6/8; mean words 31.0 -> 8.9 (the base's replies run into
    # MAX_TOKENS, the student's end on their own).
    assert before <= 2
    assert after >= 4
    assert words_after < words_before / 2
    assert "Paris" in results[-1]["after"]["reply"]
