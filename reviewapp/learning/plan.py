"""What a run's evaluation, gate and deploy use, frozen on the run when it is created.

A run is judged and deployed by the thresholds, deploy choices and model servers of the moment
it was started (with its config and data split, learning/runs.py): a settings change made while
it trains is for the next run. The frozen servers are still checked against the operator's list
where they are used, so a server the operator withdrew meanwhile is not called.
"""

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reviewapp.learning.lessons import contradicting_lessons
from reviewapp.learning.models import Adapter, DistillationTarget, ModelRoute, TrainingRun
from reviewapp.projects.models import Project
from reviewapp.projects.outbound import usable_upstreams
from reviewapp.projects.project_settings import ProjectSettings, settings_for
from training.gate import GateThresholds


class ServingAdapterPlan(BaseModel):
    """The adapter whose route was live when the run was created: the gate's "before" side."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: int
    path: str


class ConflictItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target_id: int
    trace_id: int
    trace: str  # the trace's external id
    of: str  # the lesson whose target it is
    fails: str  # the other lesson's checks it fails


class LessonConflict(BaseModel):
    """Two lessons an approved target cannot both follow (learning/lessons.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lesson: str
    other: str
    count: int
    items: tuple[ConflictItem, ...]


class RunPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gate: GateThresholds
    auto_deploy: bool  # a run that passes the gate serves traffic without a click
    canary_share: int = Field(ge=1, le=100)  # percent of traffic the new adapter gets
    deploy_quorum: int = Field(ge=0)  # servers that must load the adapter first; 0: all
    # The model servers (base URLs) its evaluation asks and its deploy loads the adapter on.
    upstreams: tuple[str, ...] = Field(min_length=1)
    # What the candidate is judged against; None: the base served (or a plan from before).
    serving_adapter: ServingAdapterPlan | None = None
    # Lessons its targets contradict, found before training: shown, not averaged silently.
    conflicts: tuple[LessonConflict, ...] = ()

    @field_validator("gate", mode="before")
    @classmethod
    def _stored_gate_is_thresholds(cls, value: Any) -> Any:
        # Stored as JSON; the library's dataclass is strict and takes only itself or keywords.
        return GateThresholds.from_settings(value) if isinstance(value, dict) else value

    @classmethod
    def from_settings(
        cls,
        *,
        project: Project,
        project_settings: ProjectSettings,
        targets: Sequence[DistillationTarget] = (),
    ) -> "RunPlan":
        """`targets`: what the run learns from, checked for contradicting lessons."""
        return cls(
            gate=project_settings.gate_thresholds(),
            auto_deploy=project_settings.auto_deploy,
            canary_share=project_settings.canary_share,
            deploy_quorum=project_settings.deploy_quorum_or_default(),
            upstreams=tuple(project_settings.model_servers(project)),
            serving_adapter=serving_adapter(project),
            conflicts=contradicting_lessons(targets),
        )

    def model_servers(self, project: Project) -> list[str]:
        """The frozen servers the operator still allows (MODEL_SERVERS or the project's own)."""
        return usable_upstreams(project, list(self.upstreams))


def serving_adapter(project: Project) -> ServingAdapterPlan | None:
    """The adapter answering the project's primary route now, if it is one of its own on the
    project's base model (an adapter of another base cannot be loaded beside the candidate)."""
    primary = ModelRoute.objects.filter(project=project).values_list("primary", flat=True).first()
    adapter = (
        Adapter.objects.filter(project=project, name=primary, base_model=project.base_model).first()
        if primary
        else None
    )
    if adapter is None:
        return None
    return ServingAdapterPlan(name=adapter.name, version=adapter.version, path=adapter.path)


def frozen_plan(run: TrainingRun) -> RunPlan | None:
    """The plan stored on the run; None for a run created before plans were stored."""
    return RunPlan.model_validate(run.plan) if run.plan else None


def run_plan(run: TrainingRun) -> RunPlan:
    """What the run's evaluation, gate and deploy use."""
    # Runs created before migration 0023 froze none: they use the project's settings as they
    # are when the run gets there, as they always did.
    return frozen_plan(run) or RunPlan.from_settings(
        project=run.project, project_settings=settings_for(run.project)
    )
