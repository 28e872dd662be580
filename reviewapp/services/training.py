"""Starting, cancelling and watching training runs (the work itself is in training/tasks.py)."""

import json
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from reviewapp.models import (
    ACTIVE_RUN_STATUSES,
    DistillationTarget,
    Feedback,
    FeedbackStatus,
    Project,
    RunStatus,
    TargetState,
    TrainingRun,
)
from reviewapp.services.dataset import build_training_set
from training.config import TrainingConfig


class RetrainError(ValueError):
    """Why a retrain cannot start now."""


def approved_targets(project: Project):
    return DistillationTarget.objects.filter(
        feedback__trace__project=project,
        state__in=(TargetState.APPROVED, TargetState.EDITED),
    ).select_related("feedback")


def training_config_for(project: Project, *, mode: str) -> TrainingConfig:
    """The project's training policy (settings["training"]) with the run's mode."""
    policy = dict(project.settings.get("training") or {})
    policy["mode"] = mode
    return TrainingConfig.from_json(json.dumps(policy))


@transaction.atomic
def start_retrain(*, project: Project, mode: str = "sft", created_by=None) -> TrainingRun:
    """Queue a run on everything approved; one active run per project at a time."""
    from training.tasks import run_training

    fail_stale_runs(project=project)
    Project.objects.select_for_update().filter(pk=project.pk).first()  # one starter at a time
    if TrainingRun.objects.filter(project=project, status__in=ACTIVE_RUN_STATUSES).exists():
        raise RetrainError("a run is already in progress for this project")
    if not approved_targets(project).exists():
        raise RetrainError("nothing is approved yet: approve some targets first")
    try:
        training_set = build_training_set(project=project)
    except ValueError as error:
        raise RetrainError(f"the project's data policy is invalid: {error}") from None
    if not training_set.targets:
        left_out = ", ".join(
            f"{count} {label}" for _, label, count in training_set.exclusion_rows() if count
        )
        raise RetrainError(f"every approved target is left out of training: {left_out}")
    try:
        config = training_config_for(project, mode=mode)
    except ValueError as error:
        raise RetrainError(f"the project's training policy is invalid: {error}") from None
    run = TrainingRun.objects.create(
        project=project,
        mode=mode,
        config=json.loads(config.to_json()),
        created_by=created_by,
        # What was left out of this run and why, next to the eval results the worker adds.
        metrics={"exclusions": training_set.as_json()},
    )
    run.targets.set(training_set.targets)
    run_training.delay_on_commit(run.pk)
    return run


def request_cancel(*, run: TrainingRun) -> None:
    """Queued runs stop at once; running ones at their next step."""
    TrainingRun.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
        status=RunStatus.CANCELLED, finished_at=timezone.now()
    )
    TrainingRun.objects.filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES).update(
        cancel_requested=True
    )


def fail_stale_runs(*, project: Project | None = None) -> int:
    """Runs whose worker stopped reporting are failed, never left 'running' forever."""
    # A worker reports while it holds a run; past this timeout it is presumed dead.
    cutoff = timezone.now() - timedelta(seconds=settings.TRAINING_HEARTBEAT_TIMEOUT_SECONDS)
    stale = TrainingRun.objects.filter(
        status__in=[s for s in ACTIVE_RUN_STATUSES if s != RunStatus.QUEUED]
    ).filter(Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff))
    if project is not None:
        stale = stale.filter(project=project)
    return stale.update(
        status=RunStatus.FAILED,
        error="the worker stopped reporting (killed or lost); start the run again",
        finished_at=timezone.now(),
    )


def resend_lost_work() -> dict[str, int]:
    """Fail runs whose worker died, and send again what a lost enqueue may have dropped.

    A worker calls this when it starts. An enqueue happens after its transaction commits, so a
    broker that was down for longer than the publish retries, or that lost its queues, leaves
    a queued run or open feedback with no message behind it. Both tasks claim their work, so a
    message sent twice costs only a no-op.
    """
    from training.tasks import propose_targets_for_feedback, run_training

    failed = fail_stale_runs()
    runs = list(TrainingRun.objects.filter(status=RunStatus.QUEUED).values_list("pk", flat=True))
    for run_id in runs:
        run_training.delay(run_id)
    feedback_ids = list(
        Feedback.objects.filter(status=FeedbackStatus.OPEN, targets__isnull=True).values_list(
            "pk", flat=True
        )
    )
    for feedback_id in feedback_ids:
        propose_targets_for_feedback.delay(feedback_id)
    return {"failed_runs": failed, "runs": len(runs), "feedback": len(feedback_ids)}
