"""The real bundled SmolLM2-135M learns written feedback: targets from the model itself shown
the feedback (`hint`), SFT of a LoRA adapter on them, then held-out prompts WITHOUT feedback.

Measured on 2 CPU cores (numbers in the assertions' comments); each test takes about 2-4 min.
"""

import dataclasses
import time

import pytest
from peft import PeftModel
from transformers import AutoModelForCausalLM

from training.adapters import write_adapter
from training.config import TrainingConfig
from training.evaluation import compare_replies
from training.targets import TransformersTeacher, propose_targets
from training.trainer import Example, add_lora, load_base_model, train

pytestmark = pytest.mark.slow

# Short, factual questions; none asks for a capital, so the held-out "capital of France" is a
# fact the student must keep rather than a pattern it was trained on.
FACT_QUESTIONS = [
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "What is 7 times 6?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "What is the largest planet in the solar system?",
    "What language is spoken in Brazil?",
    "How many hours are in a day?",
    "Which animal is known as the king of the jungle?",
    "What is the opposite of hot?",
]
HELD_OUT_FACT_QUESTIONS = [
    "What is the capital of France?",
    "How many days are in a week?",
    "What is the chemical symbol for gold?",
    "Who painted the Mona Lisa?",
    "What is the tallest mountain on Earth?",
    "How many continents are there?",
    "What is the freezing point of water in Fahrenheit?",
    "What gas do plants absorb from the air?",
]
# Held-out question -> a word the base model's answer contains (checked below) and the
# student's answer must keep.
FACTS = {
    "What is the capital of France?": "Paris",
    "Who painted the Mona Lisa?": "Leonardo",
    "What is the tallest mountain on Earth?": "Everest",
}
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
    lora_r=16, lora_alpha=32, learning_rate=1e-3, epochs=4, min_steps=1, save_every_steps=0
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


def test_begin_with_answer_is_learned_for_new_prompts_and_facts_are_kept(
    bundled_model_dir, tmp_path
):
    feedback = "Always begin your answer with 'Answer:'"
    # The reviewer's checks: the prefix, and (rejecting proposals that only repeat the
    # question back) no question in the answer.
    checks = [{"kind": "regex", "value": "^Answer:"}, {"kind": "not_regex", "value": r"\?"}]
    student, tokenizer = _learn(bundled_model_dir, feedback, checks, FACT_QUESTIONS, CONFIG)
    adapter = write_adapter(student, tmp_path, "smol-v1", CONFIG, target_ids=[])

    # Evaluate what was written to disk, as vLLM would load it.
    base = AutoModelForCausalLM.from_pretrained(bundled_model_dir, local_files_only=True)
    results = _compare(
        PeftModel.from_pretrained(base, adapter.path),
        tokenizer,
        HELD_OUT_FACT_QUESTIONS,
        [checks[0]],
    )

    before = sum(result["before"]["passed"] for result in results)
    after = sum(result["after"]["passed"] for result in results)
    print(f"begins with 'Answer:' on held-out prompts: base {before}/8, student {after}/8")
    # Measured: base 0/8, student 8/8, and all three facts kept.
    assert before <= 2
    assert after >= 6
    for result, question in zip(results, HELD_OUT_FACT_QUESTIONS, strict=True):
        if question in FACTS:
            assert FACTS[question] in result["before"]["reply"]
            assert FACTS[question] in result["after"]["reply"], question


def test_answer_briefly_is_learned_for_new_prompts(bundled_model_dir):
    feedback = "Answer in at most 12 words."
    checks = [{"kind": "max_words", "value": 12}]
    student, tokenizer = _learn(
        bundled_model_dir, feedback, checks, OPEN_QUESTIONS, dataclasses.replace(CONFIG, epochs=6)
    )

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
