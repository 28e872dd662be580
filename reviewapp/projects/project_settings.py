"""A project's settings, one typed schema: training, gate, data policy, auto-approve, deploy,
teacher. Stored as JSON on `Project.settings`; read and written only through this module, so a
bad value is refused where it is written, with a message that names the field.
"""

import copy
from functools import partial
from typing import Any, Literal, get_args

from django.conf import settings
from django.db import transaction
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from reviewapp.projects.models import Project
from reviewapp.projects.outbound import (
    OutboundRefused,
    base_url,
    check_teacher_key,
    check_teacher_url,
    check_upstream,
    teacher_key,
    usable_upstreams,
)
from training.config import (
    ConfigError,
    TrainingConfig,
    TrainingMode,
    validation_problems,
)
from training.gate import GateThresholds


class SettingsError(ValueError):
    """Settings that are not valid; the message names each bad field, and `problems` holds
    them as (`section.field`, what is wrong), for a form that shows each beside its field."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__(
            "; ".join(f"{field}: {message}" if field else message for field, message in problems)
        )


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PolicyChoice = Literal["keep", "exclude"]
POLICY_CHOICES: tuple[str, ...] = get_args(PolicyChoice)
AutoApprovePolicy = Literal["manual", "checks_pass"]
AUTO_APPROVE_CHOICES: tuple[str, ...] = get_args(AutoApprovePolicy)


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

    Both are the operator's to offer (reviewapp/projects/outbound.py): `url` one of the deployment's
    model servers or TEACHER_SERVERS, `key_name` one of the keys it declares in TEACHER_API_KEYS.
    The secret itself is never stored here.
    """

    url: str = ""  # an OpenAI-compatible base URL ending in /v1; blank: the project's upstream
    model: str = Field("", max_length=200)  # the model name there; blank: the project's model
    key_name: str = Field("", max_length=100)  # blank: no key is sent

    @field_validator("url")
    @classmethod
    def _url_is_a_base_url(cls, value: str) -> str:
        return base_url(value) if value.strip() else ""

    def api_key(self) -> str | None:
        return teacher_key(self.key_name)


class _Overrides(_Section):
    """A section of overrides of a training-library dataclass: read, it has the library's
    defaults; stored, only what was set, so a default changed in the library reaches every
    project that did not choose its own."""

    # As strict as the library's own dataclasses: 1e11 is not an epoch count, NaN not a rate.
    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _only_what_is_set(self, handler) -> dict[str, Any]:
        return {
            name: value for name, value in handler(self).items() if name in self.model_fields_set
        }

    def overrides(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.model_fields_set}


def is_overrides(section: type[BaseModel]) -> bool:
    """Whether a section stores only what was set (blank in a form: the library's default)."""
    return issubclass(section, _Overrides)


def _overrides_of(library_type: type, *, leave_out: tuple[str, ...] = ()) -> type[_Overrides]:
    """An _Overrides section with `library_type`'s fields: the same types, bounds and defaults,
    taken from the dataclass so they are written once."""
    fields = {
        name: (info.annotation, copy.copy(info))
        for name, info in library_type.__pydantic_fields__.items()
        if name not in leave_out
    }
    return create_model(f"_{library_type.__name__}Fields", __base__=_Overrides, **fields)


class TrainingOverrides(_overrides_of(TrainingConfig, leave_out=("mode",))):
    """This project's changes to TrainingConfig's defaults; the mode is chosen per run."""

    @model_validator(mode="before")
    @classmethod
    def _mode_is_not_a_setting(cls, values: Any) -> Any:
        if isinstance(values, dict) and "mode" in values:
            raise ValueError("mode is chosen per run, not in the project's settings")
        return values

    @field_validator("target_modules", mode="before")
    @classmethod
    def _stored_list_is_a_tuple(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value  # JSON has no tuples

    @model_validator(mode="after")
    def _fields_agree(self) -> "TrainingOverrides":
        self.config(mode="sft")  # the checks across fields (effective batch size)
        return self

    def config(self, *, mode: TrainingMode) -> TrainingConfig:
        try:
            return TrainingConfig(mode=mode, **self.overrides())
        except ValidationError as error:
            raise ConfigError(validation_problems(error)) from None


class GateOverrides(_overrides_of(GateThresholds)):
    """This project's changes to the evaluation gate's default thresholds."""

    def thresholds(self) -> GateThresholds:
        return GateThresholds(**self.overrides())


class ProjectSettings(_Section):
    training: TrainingOverrides = TrainingOverrides()
    gate: GateOverrides = GateOverrides()
    data_policy: DataPolicy = DataPolicy()
    # "checks_pass": a teacher proposal that passes its feedback's checks is approved as made.
    auto_approve: AutoApprovePolicy = "manual"
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
        urls = [base_url(url) for url in value]
        if len(set(urls)) != len(urls):
            raise ValueError("an upstream is listed twice")
        return urls

    def training_config(self, *, mode: TrainingMode) -> TrainingConfig:
        return self.training.config(mode=mode)

    def gate_thresholds(self) -> GateThresholds:
        return self.gate.thresholds()

    def deploy_quorum_or_default(self) -> int:
        """Model servers that must load an adapter before it is routed to; 0: all of them."""
        return self.deploy_quorum or settings.DEPLOY_QUORUM

    def model_servers(self, project: Project) -> list[str]:
        """The project's model servers: its `upstreams` the operator still allows, else its one
        upstream (or VLLM_URL), both the operator's."""
        listed = usable_upstreams(project, self.upstreams)
        return listed or [(project.upstream_url or settings.VLLM_URL).rstrip("/")]


def parse_settings(values: dict) -> ProjectSettings:
    """Validate stored or submitted settings; SettingsError names each bad field."""
    try:
        return ProjectSettings.model_validate(values or {})
    except ValidationError as error:
        raise SettingsError(validation_problems(error)) from None


def settings_for(project: Project) -> ProjectSettings:
    return parse_settings(project.settings)


def _check_reach(project: Project, changed: ProjectSettings, sections: set[str]) -> None:
    """The addresses and keys among the changed sections must be ones the operator offers.
    Checked only where they change: a list the operator shrank since does not block other
    sections (what is stored and no longer allowed is skipped where it is used)."""
    checks = []  # (field, check)
    if "upstreams" in sections:
        checks += [
            (f"upstreams.{index}", partial(check_upstream, project, url))
            for index, url in enumerate(changed.upstreams)
        ]
    if "teacher" in sections and changed.teacher.url:
        checks.append(("teacher.url", partial(check_teacher_url, project, changed.teacher.url)))
    if "teacher" in sections and changed.teacher.key_name:
        checks.append(("teacher.key_name", partial(check_teacher_key, changed.teacher.key_name)))
    problems = []
    for field, check in checks:
        try:
            check()
        except OutboundRefused as error:
            problems.append((field, str(error)))
    if problems:
        raise SettingsError(problems)


@transaction.atomic
def update_settings(*, project: Project, changes: dict) -> ProjectSettings:
    """Merge `changes` (whole sections) into the project's settings, all valid or none stored."""
    locked = Project.objects.select_for_update().get(pk=project.pk)
    merged = parse_settings({**(locked.settings or {}), **changes})
    _check_reach(locked, merged, set(changes))
    locked.settings = merged.model_dump(mode="json")
    locked.save(update_fields=["settings"])
    project.settings = locked.settings
    return merged
