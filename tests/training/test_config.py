import dataclasses
import json

import pytest

from training.config import TrainingConfig


def test_defaults_follow_the_design():
    config = TrainingConfig()

    assert (config.lora_r, config.lora_alpha, config.target_modules) == (16, 32, "all-linear")
    assert (config.top_k, config.teacher_prompt, config.base_kl_weight) == (20, "hint", 0.1)


@pytest.mark.parametrize(("mode", "learning_rate"), [("sft", 1e-4), ("distill", 5e-5)])
def test_learning_rate_defaults_by_mode(mode, learning_rate):
    assert TrainingConfig(mode=mode).effective_learning_rate == learning_rate


def test_explicit_learning_rate_wins():
    assert TrainingConfig(mode="distill", learning_rate=3e-4).effective_learning_rate == 3e-4


def test_changing_mode_changes_the_default_learning_rate():
    distill = dataclasses.replace(TrainingConfig(mode="sft"), mode="distill")

    assert distill.effective_learning_rate == 5e-5


def test_effective_batch_of_32_is_allowed():
    config = TrainingConfig(per_device_batch_size=8, gradient_accumulation_steps=4)

    assert config.effective_batch_size == 32


def test_effective_batch_above_32_is_rejected():
    with pytest.raises(ValueError, match=r"effective batch size .* = 48\) must be <= 32"):
        TrainingConfig(per_device_batch_size=16, gradient_accumulation_steps=3)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mode", "rl", "mode must be 'sft' or 'distill'"),
        ("lora_r", 0, "lora_r must be >= 1"),
        ("lora_alpha", 0, "lora_alpha must be > 0"),
        ("lora_dropout", 1.0, r"lora_dropout must be in \[0, 1\)"),
        ("target_modules", (), "target_modules must be"),
        ("target_modules", ["q_proj"], "target_modules must be"),
        ("learning_rate", 0.0, "learning_rate must be > 0"),
        ("epochs", 0, "epochs must be >= 1"),
        ("per_device_batch_size", 0, "per_device_batch_size must be >= 1"),
        ("gradient_accumulation_steps", 0, "gradient_accumulation_steps must be >= 1"),
        ("max_seq_len", 0, "max_seq_len must be >= 1"),
        ("top_k", 0, "top_k must be >= 1"),
        ("teacher_prompt", "shout", "teacher_prompt must be 'hint' or 'rewrite'"),
        ("base_kl_weight", -0.1, "base_kl_weight must be >= 0"),
        ("save_every_steps", -1, "save_every_steps must be >= 0"),
        ("warmup_ratio", 1.0, r"warmup_ratio must be in \[0, 1\)"),
        ("weight_decay", -0.01, "weight_decay must be >= 0"),
        ("max_grad_norm", -1.0, "max_grad_norm must be >= 0"),
        ("sample_max_tokens", 0, "sample_max_tokens must be >= 1"),
        ("sample_temperature", 0.0, "sample_temperature must be > 0"),
        ("sample_max_tokens", 8.0, "sample_max_tokens must be an integer"),
        ("epochs", "3", "epochs must be an integer"),
        ("top_k", True, "top_k must be an integer"),
        ("base_kl_weight", "0.1", "base_kl_weight must be a number"),
        ("learning_rate", "1e-4", "learning_rate must be a number"),
        ("bf16", "yes", "bf16 must be true, false or null"),
        ("bf16", 1, "bf16 must be true, false or null"),
    ],
)
def test_invalid_values_are_rejected_with_a_clear_message(field, value, message):
    with pytest.raises(ValueError, match=message):
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
    with pytest.raises(ValueError, match="unknown training config keys: warmup"):
        TrainingConfig.from_json(json.dumps({"warmup": 10}))


def test_json_values_are_validated():
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        TrainingConfig.from_json('{"top_k": 0}')
