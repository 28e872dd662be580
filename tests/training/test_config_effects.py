"""Every TrainingConfig field changes what a run does: a recorded knob is a knob that works.

Trainer fields: the same tiny run with one field changed trains differently (steps, tokens,
sequences left out, the loss curve, the adapter's weights or its shape). Fields the run uses
outside the trainer (teacher_prompt, held_out_fraction, replay_examples, gate_candidates) are
shown where the run uses them (replay_examples in test_job.py); each test names its field.
"""

import dataclasses
import hashlib

import pytest
import torch

from reviewapp.learning.retrain import _training_data
from training.config import TrainingConfig
from training.eval_sets import held_out_feedback
from training.trainer import DistillItem, Example, add_lora, load_base_model, train

QUESTIONS = ["what is the capital of france ?", "say hello", "what is red ?", "say one two"]
FEEDBACK = "always begin with answer :"
BASE = TrainingConfig(
    lora_r=4,
    lora_alpha=8,
    learning_rate=1e-2,
    epochs=2,
    min_steps=1,
    per_device_batch_size=2,
    save_every_steps=0,
    max_seq_len=64,
    sample_max_tokens=4,
    base_kl_weight=0.0,
)
# A change for every field the trainer reads; the tests below cover the others.
TRAINER_CHANGES = {
    "lora_r": 8,
    "lora_alpha": 32,
    "lora_dropout": 0.5,
    "target_modules": ("q_proj", "v_proj"),
    "learning_rate": 1e-3,
    "warmup_ratio": 0.5,
    "weight_decay": 0.5,
    "max_grad_norm": 1e-4,
    "epochs": 3,
    "min_steps": 6,
    "per_device_batch_size": 1,
    "gradient_accumulation_steps": 2,
    "max_seq_len": 22,  # the longest question no longer fits: it is left out
    "seed": 1,
    "base_kl_weight": 1.0,
}
DISTILL_CHANGES = {"top_k": 2, "sample_max_tokens": 2, "sample_temperature": 0.3}
RUN_LEVEL = {"mode", "teacher_prompt", "replay_examples", "save_every_steps", "bf16"}
# sft with examples that carry the answer they replaced (a test of their own below).
RUN_LEVEL |= {"preference_weight", "preference_beta"}
# start_from: tests/training/test_job.py (the job, not the trainer, loads the serving weights);
# preference_lessons: there too (the job chooses whose pairs the trainer gets).
ELSEWHERE = {"held_out_fraction", "gate_candidates", "start_from", "preference_lessons"}
# guard_keeps: test_job.py (the job loads the serving adapter as the guard's) and
# test_trainer.py (the guard holds the student to the adapter it is given).
ELSEWHERE |= {"guard_keeps"}
# guard_reference: tests/training/test_job.py (the job chooses who answers the general prompts)
# and test_trainer.py (the guard's base side under the teacher's context).
ELSEWHERE |= {"guard_reference"}
# max_tokens_per_pass changes how many rows a forward pass holds and, by design, nothing else:
# test_trainer.py counts the rows and compares the update with one pass's.
ELSEWHERE |= {"max_tokens_per_pass"}
# teacher_edits: tests/training/test_targets.py (the edit proposed first) and
# tests/learning/test_targets_keep_earlier_lessons.py (the worker asks as the project says).
ELSEWHERE |= {"teacher_edits"}


def _examples() -> list[Example]:
    return [
        Example([{"role": "user", "content": q}], {"role": "assistant", "content": f"answer : {q}"})
        for q in QUESTIONS
    ]


def _items() -> list[DistillItem]:
    return [
        DistillItem(
            [{"role": "user", "content": q}],
            [{"role": "user", "content": f"{q} reviewer feedback : {FEEDBACK}"}],
        )
        for q in QUESTIONS
    ]


def _fingerprint(make_tiny_llama, tokenizer, config: TrainingConfig, **data) -> tuple:
    """What a run did: steps, tokens, left-out sequences, loss curve, adapter shape and weights."""
    model = add_lora(make_tiny_llama(seed=0), config)
    result = train(model, tokenizer, config, replay=_examples()[:2], **data)
    weights = {name: tensor.float() for name, tensor in model.named_parameters() if "lora_" in name}
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].detach().numpy().round(6).tobytes())
    return (
        result.steps,
        result.tokens,
        result.skipped,
        [round(loss, 6) for loss in result.loss_curve],
        digest.hexdigest(),
    )


def test_every_field_is_covered_by_a_test_of_its_effect():
    fields = {field.name for field in dataclasses.fields(TrainingConfig)}

    assert fields == set(TRAINER_CHANGES) | set(DISTILL_CHANGES) | RUN_LEVEL | ELSEWHERE


@pytest.mark.parametrize(("field", "value"), TRAINER_CHANGES.items())
def test_a_trainer_field_changes_the_run(field, value, make_tiny_llama, make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()
    changed = dataclasses.replace(BASE, **{field: value})

    baseline = _fingerprint(make_tiny_llama, tokenizer, BASE, examples=_examples())
    after = _fingerprint(make_tiny_llama, tokenizer, changed, examples=_examples())

    assert after != baseline


@pytest.mark.parametrize(("field", "value"), DISTILL_CHANGES.items())
def test_a_distill_field_changes_the_run(field, value, make_tiny_llama, make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()
    distill = dataclasses.replace(BASE, mode="distill")
    changed = dataclasses.replace(distill, **{field: value})

    baseline = _fingerprint(make_tiny_llama, tokenizer, distill, items=_items())
    after = _fingerprint(make_tiny_llama, tokenizer, changed, items=_items())

    assert after != baseline


def test_mode_chooses_what_is_trained_on(make_tiny_llama, make_tiny_tokenizer):
    tokenizer = make_tiny_tokenizer()

    sft = _fingerprint(make_tiny_llama, tokenizer, BASE, examples=_examples())
    distill = _fingerprint(
        make_tiny_llama, tokenizer, dataclasses.replace(BASE, mode="distill"), items=_items()
    )

    assert sft != distill


def test_save_every_steps_writes_checkpoints(make_tiny_llama, make_tiny_tokenizer, tmp_path):
    config = dataclasses.replace(BASE, save_every_steps=2)
    model = add_lora(make_tiny_llama(seed=0), config)

    result = train(
        model, make_tiny_tokenizer(), config, examples=_examples(), checkpoint_dir=tmp_path
    )

    assert [path.name for path in result.checkpoints] == ["step-000002", "step-000004"]


@pytest.mark.parametrize(
    ("baseline", "changed"),
    [
        ({"preference_weight": 0.0}, {"preference_weight": 1.0}),
        ({"preference_weight": 1.0}, {"preference_weight": 1.0, "preference_beta": 1.0}),
    ],
    ids=["preference_weight", "preference_beta"],
)
def test_a_preference_field_changes_a_run_on_replaced_answers(
    baseline, changed, make_tiny_llama, make_tiny_tokenizer
):
    tokenizer = make_tiny_tokenizer()
    examples = [
        dataclasses.replace(example, rejected={"role": "assistant", "content": "no"})
        for example in _examples()
    ]

    before = _fingerprint(
        make_tiny_llama, tokenizer, dataclasses.replace(BASE, **baseline), examples=examples
    )
    after = _fingerprint(
        make_tiny_llama, tokenizer, dataclasses.replace(BASE, **changed), examples=examples
    )

    assert after != before


class _Target:
    """What _training_data reads of a DistillationTarget."""

    def __init__(self, context, original, reply, feedback_text):
        self.pk = 1  # the key of the tools dict the tests pass
        self.student_context, self.original, self.target = context, original, reply
        self.source, self.teacher_context = "hint", None  # not stored: built from the feedback
        self.feedback = type("Feedback", (), {"text": feedback_text, "trace_id": 1})


@pytest.mark.parametrize(("prompt", "shows_original"), [("hint", False), ("rewrite", True)])
def test_teacher_prompt_decides_what_the_distill_teacher_sees(prompt, shows_original):
    original = {"role": "assistant", "content": "rome"}
    target = _Target([{"role": "user", "content": "capital of france ?"}], original, {}, "paris")
    config = dataclasses.replace(BASE, mode="distill", teacher_prompt=prompt)

    [item] = _training_data(config, [target], {1: None})["items"]

    assert (original in item.teacher_context) is shows_original
    assert "paris" in str(item.teacher_context)


def test_held_out_fraction_decides_how_much_feedback_is_held_out():
    texts = dict.fromkeys(range(10), "same feedback")

    assert len(held_out_feedback(texts, fraction=0.2, seed=0)) == 2
    assert len(held_out_feedback(texts, fraction=0.5, seed=0)) == 5


def test_bf16_loads_the_model_in_bfloat16(make_tiny_llama, make_tiny_tokenizer, tmp_path):
    make_tiny_llama(seed=0).save_pretrained(tmp_path)
    make_tiny_tokenizer().save_pretrained(tmp_path)

    bf16, _ = load_base_model(tmp_path, dataclasses.replace(BASE, bf16=True))
    fp32, _ = load_base_model(tmp_path, dataclasses.replace(BASE, bf16=False))

    assert (bf16.dtype, fp32.dtype) == (torch.bfloat16, torch.float32)
