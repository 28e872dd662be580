"""The `training` and `gate` sections are typed sections of the settings schema, built from the
training library's own fields: the same bounds, the library's defaults when read, and only the
overrides stored."""

import dataclasses
import math
from typing import get_args

import pytest

from reviewapp.learning.forms import AutoApproveForm, RetrainForm
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import (
    ProjectSettings,
    SettingsError,
    TrainingOverrides,
    parse_settings,
    settings_for,
    update_settings,
)
from training.config import TrainingConfig
from training.gate import GateThresholds


def _numeric_fields(cls) -> list[tuple[str, type]]:
    numeric = []
    for field in dataclasses.fields(cls):
        kinds = {field.type, *get_args(field.type)}
        if int in kinds or float in kinds:
            numeric.append((field.name, int if int in kinds else float))
    return numeric


def test_the_training_section_has_every_field_of_the_config_but_the_mode():
    library = {field.name for field in dataclasses.fields(TrainingConfig)}

    assert set(TrainingOverrides.model_fields) == library - {"mode"}


@pytest.mark.parametrize(
    ("section", "field", "kind"),
    [("training", *field) for field in _numeric_fields(TrainingConfig)]
    + [("gate", *field) for field in _numeric_fields(GateThresholds)],
)
def test_every_library_bound_holds_in_the_settings_naming_the_field(section, field, kind):
    with pytest.raises(SettingsError, match=rf"^{section}\.{field}: Input should be less than"):
        parse_settings({section: {field: kind(10**11)}})


@pytest.mark.parametrize("section", ["training", "gate"])
def test_a_value_that_is_not_finite_is_refused(section):
    field = "max_grad_norm" if section == "training" else "max_mean_drift"

    with pytest.raises(SettingsError, match=rf"^{section}\.{field}: Input should be a finite"):
        parse_settings({section: {field: math.nan}})


def test_fields_that_disagree_are_refused_under_the_section():
    with pytest.raises(SettingsError, match=r"^training: effective batch size"):
        parse_settings(
            {"training": {"per_device_batch_size": 16, "gradient_accumulation_steps": 4}}
        )


def test_a_section_read_gives_the_library_defaults_for_what_is_not_set(project):
    update_settings(project=project, changes={"training": {"min_steps": 8}})

    stored = settings_for(Project.objects.get(pk=project.pk))

    assert (stored.training.min_steps, stored.training.epochs) == (8, TrainingConfig().epochs)
    assert stored.gate.thresholds() == GateThresholds()


def test_only_the_overrides_are_stored(project):
    update_settings(
        project=project,
        changes={"training": {"min_steps": 8, "learning_rate": None}, "gate": {"max_regressed": 2}},
    )

    stored = Project.objects.get(pk=project.pk).settings
    assert stored["training"] == {"min_steps": 8, "learning_rate": None}
    assert stored["gate"] == {"max_regressed": 2}


def test_settings_stored_before_keep_parsing_to_the_same_config(project):
    Project.objects.filter(pk=project.pk).update(
        settings={
            "training": {"target_modules": ["q_proj", "v_proj"], "lora_r": 8, "bf16": None},
            "gate": {"min_fixed_fraction": 1, "max_mean_drift": 0.5},
        }
    )

    stored = settings_for(Project.objects.get(pk=project.pk))

    config = stored.training_config(mode="distill")
    assert (config.mode, config.target_modules, config.lora_r) == (
        "distill",
        ("q_proj", "v_proj"),
        8,
    )
    assert stored.gate_thresholds() == GateThresholds(min_fixed_fraction=1.0, max_mean_drift=0.5)


def test_the_forms_offer_the_choices_the_schema_allows():
    auto_approve = get_args(ProjectSettings.model_fields["auto_approve"].annotation)
    modes = get_args(TrainingConfig.__pydantic_fields__["mode"].annotation)

    assert [value for value, _ in AutoApproveForm().fields["policy"].choices] == list(auto_approve)
    assert [value for value, _ in RetrainForm().fields["mode"].choices] == list(modes)
