import dataclasses
import json

import pytest

from training.config import TrainingConfig


def test_defaults_follow_the_design():
    config = TrainingConfig()

    assert (config.lora_r, config.lora_alpha, config.target_modules) == (16, 32, "all-linear")
    assert (config.top_k, config.teacher_prompt, config.base_kl_weight) == (20, "hint", 2.0)


@pytest.mark.parametrize(("mode", "learning_rate"), [("sft", 3e-4), ("distill", 1e-4)])
def test_learning_rate_defaults_by_mode(mode, learning_rate):
    assert TrainingConfig(mode=mode).effective_learning_rate == learning_rate


def test_explicit_learning_rate_wins():
    assert TrainingConfig(mode="distill", learning_rate=3e-4).effective_learning_rate == 3e-4


def test_changing_mode_changes_the_default_learning_rate():
    distill = dataclasses.replace(TrainingConfig(mode="sft"), mode="distill")

    assert distill.effective_learning_rate == 1e-4


def test_effective_batch_of_32_is_allowed():
    config = TrainingConfig(per_device_batch_size=8, gradient_accumulation_steps=4)

    assert config.effective_batch_size == 32


def test_effective_batch_above_32_is_rejected():
    with pytest.raises(ValueError, match=r"effective batch size .* = 48\) must be <= 32"):
        TrainingConfig(per_device_batch_size=16, gradient_accumulation_steps=3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mode", "rl"),
        ("lora_dropout", 1.0),
        ("warmup_ratio", 1.0),
        ("min_steps", 0),
        ("replay_examples", -1),
        ("held_out_fraction", 1.0),
        ("lora_r", 0),
        ("lora_alpha", 0),
        ("target_modules", ()),
        ("target_modules", ["q_proj"]),
        ("learning_rate", 0.0),
        ("epochs", 0),
        ("per_device_batch_size", 0),
        ("gradient_accumulation_steps", 0),
        ("max_seq_len", 0),
        ("top_k", 0),
        ("teacher_prompt", "shout"),
        ("base_kl_weight", -0.1),
        ("save_every_steps", -1),
        ("weight_decay", -0.01),
        ("max_grad_norm", -1.0),
        ("sample_max_tokens", 0),
        ("sample_temperature", 0.0),
        ("sample_max_tokens", 8.0),
        ("epochs", "3"),
        ("top_k", True),
        ("base_kl_weight", "0.1"),
        ("learning_rate", "1e-4"),
        ("bf16", "yes"),
        ("bf16", 1),
    ],
)
def test_invalid_values_are_rejected_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"(?m)^{field}\b"):
        TrainingConfig(**{field: value})


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainingConfig().epochs = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("bf16", "cuda_available", "expected"),
    [
        (None, True, True),
        (None, False, False),
        (False, True, False),
        (True, False, True),
    ],
)
def test_bf16_is_automatic_on_cuda_unless_set(bf16, cuda_available, expected):
    assert TrainingConfig(bf16=bf16).use_bf16(cuda_available=cuda_available) is expected


def test_json_round_trip_keeps_every_field():
    config = TrainingConfig(
        mode="distill",
        target_modules=("q_proj", "v_proj"),
        learning_rate=2e-5,
        bf16=False,
        save_every_steps=50,
    )

    assert TrainingConfig.from_json(config.to_json()) == config


def test_json_missing_keys_take_defaults():
    assert TrainingConfig.from_json('{"mode": "distill"}') == TrainingConfig(mode="distill")


def test_json_unknown_keys_are_rejected():
    with pytest.raises(ValueError, match="warmup: Unexpected keyword argument"):
        TrainingConfig.from_json(json.dumps({"warmup": 10}))


def test_json_values_are_validated():
    with pytest.raises(ValueError, match="top_k: Input should be greater than or equal to 1"):
        TrainingConfig.from_json('{"top_k": 0}')


@pytest.mark.parametrize(
    ("examples", "batch_size", "passes"),
    # 3 passes of 8-example batches would be 1-6 updates: a small set gets smaller batches and
    # enough passes for min_steps (24); a large one keeps the configured batch and epochs.
    [(4, 1, 6), (8, 2, 6), (16, 4, 6), (40, 8, 5), (100, 8, 3)],
)
def test_training_is_sized_by_the_data(examples, batch_size, passes):
    config = TrainingConfig()

    assert (config.batch_size_for(examples), config.passes_for(examples)) == (batch_size, passes)


@pytest.mark.parametrize(
    ("new_lessons", "steps"),
    # 16 targets in batches of 4: 4 updates a pass. Two lessons the weights have not learned
    # get twice the updates of one; none is still one (a run always has something to learn).
    [(0, 24), (1, 24), (2, 48), (3, 72)],
)
def test_each_lesson_the_starting_weights_have_not_learned_gets_min_steps(new_lessons, steps):
    config = TrainingConfig()

    batch_size = config.batch_size_for(16, new_lessons)
    passes = config.passes_for(16, new_lessons)

    assert (batch_size, 16 // batch_size * passes) == (4, steps)


def test_min_steps_of_one_trains_by_epochs_and_batch_size_alone():
    config = TrainingConfig(min_steps=1, epochs=2, per_device_batch_size=8)

    assert (config.batch_size_for(8), config.passes_for(8)) == (8, 2)
