"""Every number in a training config and in the gate's thresholds has a lower and an upper
bound: an absurd value is refused naming its field, a large real one is accepted."""

import dataclasses
import json
import math
from typing import get_args

import pytest

from training.config import TrainingConfig
from training.gate import GateThresholds


def _numeric_fields(cls) -> list[tuple[str, type]]:
    numeric = []
    for field in dataclasses.fields(cls):
        kinds = {field.type, *get_args(field.type)}
        if int in kinds or float in kinds:
            numeric.append((field.name, int if int in kinds else float))
    return numeric


TRAINING_FIELDS = _numeric_fields(TrainingConfig)
GATE_FIELDS = _numeric_fields(GateThresholds)


def test_the_numeric_fields_are_found():
    assert {"epochs", "learning_rate", "lora_r", "seed", "held_out_fraction"} <= {
        name for name, _ in TRAINING_FIELDS
    }
    assert {name for name, _ in GATE_FIELDS} == {
        "max_regressed",
        "min_fixed_fraction",
        "min_held_out_fixed_fraction",
        "max_held_out_adherence_drop",
        "max_regression_failures",
        "max_facts_lost_from_base",
        "max_newly_garbled",
        "max_mean_drift",
    }


@pytest.mark.parametrize(("field", "kind"), TRAINING_FIELDS)
def test_an_absurdly_large_training_value_is_refused_naming_the_field(field, kind):
    with pytest.raises(ValueError, match=rf"^{field}: Input should be less than"):
        TrainingConfig.from_json(json.dumps({field: kind(10**11)}))


@pytest.mark.parametrize(("field", "kind"), TRAINING_FIELDS)
def test_a_negative_training_value_is_refused_naming_the_field(field, kind):
    with pytest.raises(ValueError, match=rf"^{field}: Input should be greater than"):
        TrainingConfig.from_json(json.dumps({field: kind(-1)}))


@pytest.mark.parametrize("field", [name for name, kind in TRAINING_FIELDS if kind is float])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_training_value_that_is_not_finite_is_refused(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: Input should be a finite number"):
        TrainingConfig.from_json(json.dumps({field: value}))


@pytest.mark.parametrize(("field", "kind"), GATE_FIELDS)
def test_an_absurdly_large_threshold_is_refused_naming_it(field, kind):
    with pytest.raises(ValueError, match=rf"^{field}: Input should be less than"):
        GateThresholds.from_settings({field: kind(10**11)})


@pytest.mark.parametrize(("field", "kind"), GATE_FIELDS)
def test_a_negative_threshold_is_refused_naming_it(field, kind):
    with pytest.raises(ValueError, match=rf"^{field}: Input should be greater than"):
        GateThresholds.from_settings({field: kind(-1)})


@pytest.mark.parametrize("field", ["min_fixed_fraction", "min_held_out_fixed_fraction"])
def test_a_fraction_above_one_is_refused(field):
    with pytest.raises(ValueError, match=rf"^{field}: Input should be less than or equal to 1"):
        GateThresholds.from_settings({field: 1.5})


def test_an_unknown_threshold_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^max_drift: Unexpected keyword argument"):
        GateThresholds.from_settings({"max_drift": 1.0})


def test_a_large_run_a_person_could_mean_is_accepted():
    config = TrainingConfig.from_json(
        '{"epochs": 100, "min_steps": 10000, "max_seq_len": 32768, "lora_r": 512,'
        ' "lora_alpha": 1024, "per_device_batch_size": 32, "learning_rate": 0.1,'
        ' "replay_examples": 10000, "sample_max_tokens": 4096, "gate_candidates": 10,'
        ' "seed": 4294967295}'
    )

    assert (config.epochs, config.max_seq_len, config.seed) == (100, 32768, 2**32 - 1)


def test_lenient_thresholds_a_person_could_mean_are_accepted():
    thresholds = GateThresholds.from_settings(
        {"max_regressed": 1000, "min_fixed_fraction": 0, "max_mean_drift": 100}
    )

    assert (thresholds.max_regressed, thresholds.min_fixed_fraction) == (1000, 0.0)
