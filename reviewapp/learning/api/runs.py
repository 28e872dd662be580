"""Retrain over the API: start a run on what is approved, watch it, list the adapters and the
lessons ledger."""

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Router, Schema, Status
from ninja.errors import HttpError

from reviewapp.api.schemas import ERRORS, ErrorOut
from reviewapp.learning.deploy import deployment_of
from reviewapp.learning.lessons import lesson_ledger
from reviewapp.learning.models import Adapter, ModelRoute, TrainingRun
from reviewapp.learning.runs import RetrainError, is_presumed_dead, start_retrain
from reviewapp.projects.access import first_or_404
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope

router = Router(tags=["training"])


class RunIn(Schema):
    mode: Literal["sft", "distill"] = "sft"


class RunCreatedOut(Schema):
    id: int


class RunOut(Schema):
    id: int
    status: str
    mode: str
    progress: dict[str, Any]
    adapter: str | None
    eval: dict[str, Any]
    error: str
    targets: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # Active, but its worker stopped reporting: a starting worker takes it over.
    worker_lost: bool
    # What its evaluation, gate and deploy use, frozen when it was created: thresholds, the
    # adapter it is judged against, contradicting lessons (learning/plan.py).
    plan: dict[str, Any]


class DeploymentOut(Schema):
    state: Literal["serving", "canary", "idle"]
    share: int


class AdapterOut(Schema):
    name: str
    version: int
    base_model: str
    checksum: str
    created_at: datetime
    run_id: int | None
    deployment: DeploymentOut


class AdapterListOut(Schema):
    adapters: list[AdapterOut]


class LessonVersionOut(Schema):
    adapter: str
    version: int
    # The share of the lesson's held-out items passing its checks; null: none held out.
    held_out: float | None
    trained: float | None  # the same for its trained items; null: every item held out
    held_out_items: int
    trained_items: int
    learned: bool  # this version trained on it and passed the gate


class LessonOut(Schema):
    text: str
    checks: list[dict[str, Any]]
    first_learned_by: str | None
    first_learned_adherence: float | None
    # Held-out adherence (trained, where none was held out) in the newest deployed version.
    newest_deployed: str | None
    newest_deployed_adherence: float | None
    # lost: below 90% of the adherence it had when first learned.
    state: Literal["kept", "lost", "not learned", "not measured"]
    versions: list[LessonVersionOut]


class LessonListOut(Schema):
    lessons: list[LessonOut]


@router.post(
    "/runs",
    response={202: RunCreatedOut, 409: ErrorOut, **ERRORS},
    summary="Retrain",
    **requires(KeyScope.ADMIN),
)
def post_run(request: HttpRequest, payload: RunIn | None = None):
    try:
        run = start_retrain(project=request.auth, mode=(payload or RunIn()).mode)
    except RetrainError as error:
        status = 409 if "in progress" in str(error) else 422
        raise HttpError(status, str(error)) from None
    return Status(202, {"id": run.pk})


@router.get(
    "/runs/{run_id}",
    response={200: RunOut, **ERRORS},
    summary="A run's state",
    **requires(KeyScope.ADMIN),
)
def get_run(request: HttpRequest, run_id: int):
    run = first_or_404(
        TrainingRun.objects.filter(project=request.auth, pk=run_id),
        f"no run {run_id} in this project",
    )
    adapter = Adapter.objects.filter(run=run).first()
    return {
        "id": run.pk,
        "status": run.status,
        "mode": run.mode,
        "progress": run.progress,
        "adapter": adapter.name if adapter else None,
        "eval": {key: value for key, value in run.metrics.items() if key != "items"},
        "error": run.error,
        "targets": run.targets.count(),
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "worker_lost": is_presumed_dead(run),
        "plan": run.plan,
    }


@router.get(
    "/adapters",
    response={200: AdapterListOut, **ERRORS},
    summary="Adapter versions",
    **requires(KeyScope.ADMIN),
)
def list_adapters(request: HttpRequest):
    route = ModelRoute.objects.filter(project=request.auth).first()
    adapters = Adapter.objects.filter(project=request.auth).order_by("-version")
    return {
        "adapters": [
            {
                "name": adapter.name,
                "version": adapter.version,
                "base_model": adapter.base_model,
                "checksum": adapter.checksum,
                "created_at": adapter.created_at,
                "run_id": adapter.run_id,
                "deployment": deployment_of(adapter, route),
            }
            for adapter in adapters
        ]
    }


@router.get(
    "/lessons",
    response={200: LessonListOut, **ERRORS},
    summary="The lessons ledger",
    **requires(KeyScope.ADMIN),
)
def list_lessons(request: HttpRequest):
    return {
        "lessons": [
            {
                "text": row.lesson.text,
                "checks": row.lesson.checks,
                "first_learned_by": (
                    row.lesson.first_learned_by.name if row.lesson.first_learned_by else None
                ),
                "first_learned_adherence": row.lesson.first_learned_adherence,
                "newest_deployed": row.reference.name if row.reference else None,
                "newest_deployed_adherence": row.reference_adherence,
                "state": row.state,
                "versions": [
                    {
                        "adapter": entry.adapter.name,
                        "version": entry.adapter.version,
                        "held_out": entry.held_out,
                        "trained": entry.trained,
                        "held_out_items": entry.held_out_items,
                        "trained_items": entry.trained_items,
                        "learned": entry.learned,
                    }
                    for entry in row.history
                ],
            }
            for row in lesson_ledger(request.auth)
        ]
    }
