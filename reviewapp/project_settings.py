"""A project's settings, one typed schema: training, gate, data policy, auto-approve, deploy,
teacher. Stored as JSON on `Project.settings`; read and written only through this module, so a
bad value is refused where it is written, with a message that names the field.
"""

import json
import os
import re
from typing import Literal

from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reviewapp.models import Project
from training.config import TrainingConfig, describe_validation_error
from training.gate import GateThresholds


class SettingsError(ValueError):
    """A setting that is not valid; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


POLICY_CHOICES = ("keep", "exclude")
PolicyChoice = Literal["keep", "exclude"]


class DataPolicy(_Section):
    """What happens to the training data of troubled traces."""

    timeout: PolicyChoice = "keep"  # traces whose termination is timeout
    tool_error: PolicyChoice = "keep"  # traces that ended in a tool error
    failing_checks: PolicyChoice = "exclude"  # approved targets that fail their checks

    def excluded_terminations(self) -> tuple[str, ...]:
        return tuple(
            termination
            for termination, choice in (("timeout", self.timeout), ("tool_error", self.tool_error))
            if choice == "exclude"
        )


class Teacher(_Section):
    """Who writes revision targets: the project's own model (default) or another server.

    The key is never stored: `api_key_env` names the environment variable that holds it.
    """

    url: str = ""  # an OpenAI-compatible base URL ending in /v1; blank: the project's upstream
    model: str = ""  # the model name on that server; blank: the project's model
    api_key_env: str = Field("", pattern=r"^([A-Z_][A-Z0-9_]*)?$")

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class ProjectSettings(_Section):
    # Overrides of TrainingConfig's defaults for this project's runs (mode comes from the run).
    training: dict = Field(default_factory=dict)
    gate: dict = Field(default_factory=dict)  # GateThresholds overrides
    data_policy: DataPolicy = DataPolicy()
    # "checks_pass": a teacher proposal that passes its feedback's checks is approved as made.
    auto_approve: Literal["manual", "checks_pass"] = "manual"
    auto_deploy: bool = True  # a run that passes the gate serves traffic without a click
    canary_share: int = Field(100, ge=1, le=100)  # percent of traffic a new adapter gets
    teacher: Teacher = Teacher()
    # The model servers (OpenAI-compatible base URLs ending in /v1) the gateway balances across
    # and a deploy loads adapters on; empty: the project's single upstream_url (or VLLM_URL).
    upstreams: list[str] = Field(default_factory=list, max_length=32)
    # How many of them must load an adapter (and answer with it) before a deploy routes to it;
    # 0: the DEPLOY_QUORUM setting, whose default 0 means all of them.
    deploy_quorum: int = Field(0, ge=0, le=32)

    @field_validator("upstreams")
    @classmethod
    def _upstreams_are_urls(cls, value: list[str]) -> list[str]:
        urls = [url.strip().rstrip("/") for url in value]
        for url in urls:
            if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
                raise ValueError(f"{url!r} is not an http(s) URL")
        if len(set(urls)) != len(urls):
            raise ValueError("an upstream is listed twice")
        return urls

    @field_validator("training")
    @classmethod
    def _training_is_a_config(cls, value: dict) -> dict:
        if "mode" in value:
            raise ValueError("mode is chosen per run, not in the project's settings")
        TrainingConfig.from_json(json.dumps(value))
        return value

    @field_validator("gate")
    @classmethod
    def _gate_is_thresholds(cls, value: dict) -> dict:
        GateThresholds.from_settings(value)
        return value

    def training_config(self, *, mode: str) -> TrainingConfig:
        return TrainingConfig.from_json(json.dumps({**self.training, "mode": mode}))

    def gate_thresholds(self) -> GateThresholds:
        return GateThresholds.from_settings(self.gate)


def parse_settings(values: dict) -> ProjectSettings:
    """Validate stored or submitted settings; SettingsError names the first bad field."""
    try:
        return ProjectSettings.model_validate(values or {})
    except ValidationError as error:
        raise SettingsError(describe_validation_error(error)) from None


def settings_for(project: Project) -> ProjectSettings:
    return parse_settings(project.settings)


@transaction.atomic
def update_settings(*, project: Project, changes: dict) -> ProjectSettings:
    """Merge `changes` (whole sections) into the project's settings, all valid or none stored."""
    locked = Project.objects.select_for_update().get(pk=project.pk)
    merged = parse_settings({**(locked.settings or {}), **changes})
    locked.settings = merged.model_dump(mode="json")
    locked.save(update_fields=["settings"])
    project.settings = locked.settings
    return merged
