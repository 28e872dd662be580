"""Training runs: starting one, the state machine every status change goes through, cancelling,
and finding runs whose worker died.

A run moves queued -> building -> training -> evaluating -> deploying -> deployed, or ends in
trained / gate_failed / deploy_failed / failed / cancelled. Every move is one conditional UPDATE
(`WHERE status = <expected>`): a move the run is no longer in a position to make (it was
cancelled, or failed as stale while its worker was away) is refused, logged and never
overwrites what happened. A worker whose move is refused stops working on the run.

Cancel is a flag a person sets (request_cancel); the worker honours it in every phase. While it
is set, no move but to cancelled or failed is made, so the worker's next move (building ->
training, evaluating -> deploying, deploying -> deployed under the route's lock, ...) is refused
and the worker ends the run `cancelled` (end_cancelled). It also looks between training steps,
before each evaluation of a candidate and before writing the adapter (the training job's
`should_stop`, reviewapp/learning/retrain.py).
"""

import json
import logging
import socket
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from reviewapp import jobs
from reviewapp.learning.dataset import build_training_set
from reviewapp.learning.models import (
    ACTIVE_RUN_STATUSES,
    DistillationTarget,
    RunStatus,
    TrainingRun,
)
from reviewapp.learning.plan import RunPlan
from reviewapp.learning.selectors import approved_targets, good_trace_ids
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import SettingsError, settings_for
from reviewapp.review.models import Feedback, FeedbackStatus
from training.config import TrainingMode
from training.eval_sets import GENERAL_REGRESSION_PROMPTS, REPLAY_PROMPTS, held_out_feedback

logger = logging.getLogger(__name__)

# A run whose task kills its worker this many times (out of memory, say) is failed, not retried.
MAX_RUN_ATTEMPTS = 3

TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.BUILDING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.BUILDING: frozenset({RunStatus.TRAINING, RunStatus.CANCELLED, RunStatus.FAILED}),
    # training -> building: a redelivered run whose worker died starts again from its checkpoint.
    RunStatus.TRAINING: frozenset(
        {RunStatus.EVALUATING, RunStatus.BUILDING, RunStatus.CANCELLED, RunStatus.FAILED}
    ),
    RunStatus.EVALUATING: frozenset(
        {
            RunStatus.DEPLOYING,
            RunStatus.TRAINED,
            RunStatus.GATE_FAILED,
            RunStatus.CANCELLED,
            RunStatus.FAILED,
        }
    ),
    RunStatus.DEPLOYING: frozenset(
        {RunStatus.DEPLOYED, RunStatus.DEPLOY_FAILED, RunStatus.CANCELLED, RunStatus.FAILED}
    ),
}
FINAL_STATUSES = frozenset(
    {
        RunStatus.DEPLOYED,
        RunStatus.TRAINED,
        RunStatus.GATE_FAILED,
        RunStatus.DEPLOY_FAILED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    }
)


class RetrainError(ValueError):
    """Why a retrain cannot start now."""


# The statuses a run may be cancelled from; a cancel refuses every other move.
_CANCELLABLE = frozenset(
    status for status, targets in TRANSITIONS.items() if RunStatus.CANCELLED in targets
)
# The moves a cancel lets through: the run stopping, one way or the other.
_STOPPING = frozenset({RunStatus.CANCELLED, RunStatus.FAILED})


class TransitionRefused(RuntimeError):
    """The run is no longer in the status a move expected: someone else decided its fate."""


def move(run_id: int, *, source: str, target: str, **fields) -> None:
    """Move a run from `source` to `target` (with `fields`), or raise TransitionRefused.

    Refused too while a cancel is requested, unless `target` is cancelled or failed."""
    if target not in TRANSITIONS.get(source, ()):
        raise ValueError(f"{source} -> {target} is not a run transition")
    if target in FINAL_STATUSES:
        fields.setdefault("finished_at", timezone.now())
    runs = TrainingRun.objects.filter(pk=run_id, status=source)
    if target not in _STOPPING:
        runs = runs.filter(cancel_requested=False)
    moved = runs.update(status=target, heartbeat_at=timezone.now(), **fields)
    if not moved:
        current = TrainingRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        logger.warning("run %s: %s -> %s refused, it is %s", run_id, source, target, current)
        raise TransitionRefused(f"run {run_id} is {current}, not {source}")


def end_cancelled(run_id: int) -> bool:
    """End a run a person asked to cancel, in whatever phase its worker stopped; False if no
    cancel was asked for or the run had already ended (nothing is overwritten)."""
    now = timezone.now()
    ended = TrainingRun.objects.filter(
        pk=run_id, status__in=_CANCELLABLE, cancel_requested=True
    ).update(status=RunStatus.CANCELLED, finished_at=now, heartbeat_at=now)
    if ended:
        logger.info("run %s: cancelled as asked", run_id)
    return bool(ended)


def fail(run_id: int, *, error: str, log: str = "") -> bool:
    """End an active run in `failed`; False if it had already ended (nothing is overwritten)."""
    failed = TrainingRun.objects.filter(pk=run_id, status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.FAILED, error=error[:2000], log=log[-20000:], finished_at=timezone.now()
    )
    if not failed:
        logger.warning("run %s: -> failed refused, it had already ended", run_id)
    return bool(failed)


def claim(run_id: int) -> TrainingRun | None:
    """Take a run for this worker: a queued one, or one whose worker died mid-build/training.

    A redelivered task finds its run `building`/`training` with a stale heartbeat and takes it
    over (the run then resumes from its last checkpoint); a live run is left to its worker.
    """
    now = timezone.now()
    worker = socket.gethostname()[:200]
    started = TrainingRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.BUILDING,
        started_at=now,
        heartbeat_at=now,
        worker=worker,
        attempts=F("attempts") + 1,
    )
    if not started:
        resumable = TrainingRun.objects.filter(
            _stale(), pk=run_id, status__in=(RunStatus.BUILDING, RunStatus.TRAINING)
        )
        if resumable.filter(attempts__gte=MAX_RUN_ATTEMPTS).exists():
            fail(run_id, error=f"the run's worker died {MAX_RUN_ATTEMPTS} times; not retried")
            return None
        started = resumable.update(
            status=RunStatus.BUILDING, heartbeat_at=now, worker=worker, attempts=F("attempts") + 1
        )
        if started:
            logger.info("run %s: resumed after its worker stopped reporting", run_id)
    if not started:
        return None
    return TrainingRun.objects.select_related("project").get(pk=run_id)


def _stale_cutoff():
    # A worker reports while it holds a run; past this timeout it is presumed dead.
    return timezone.now() - timedelta(seconds=settings.TRAINING_HEARTBEAT_TIMEOUT_SECONDS)


def _stale() -> Q:
    cutoff = _stale_cutoff()
    return Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)


@transaction.atomic
def start_retrain(*, project: Project, mode: TrainingMode = "sft", created_by=None) -> TrainingRun:
    """Queue a run on everything approved, one active run at a time. Its config, data split
    and plan (gate thresholds, deploy choices, model servers) are fixed now, from the project's
    settings read once: a later change of them is for the next run."""
    Project.objects.select_for_update().filter(pk=project.pk).first()  # one starter at a time
    fail_stale_runs(project=project)
    if TrainingRun.objects.filter(project=project, status__in=ACTIVE_RUN_STATUSES).exists():
        raise RetrainError("a run is already in progress for this project")
    if not approved_targets(project).exists():
        raise RetrainError("nothing is approved yet: approve some targets first")
    try:
        project_settings = settings_for(project)
    except SettingsError as error:
        raise RetrainError(f"the project's settings are invalid: {error}") from None
    training_set = build_training_set(project=project, policy=project_settings.data_policy)
    if not training_set.targets:
        left_out = ", ".join(
            f"{count} {label}" for _, label, count in training_set.exclusion_rows() if count
        )
        raise RetrainError(f"every approved target is left out of training: {left_out}")
    config = project_settings.training_config(mode=mode)
    run = TrainingRun.objects.create(
        project=project,
        mode=mode,
        config=json.loads(config.to_json()),
        created_by=created_by,
        data_split=split_data(
            project=project,
            targets=training_set.targets,
            held_out_fraction=config.held_out_fraction,
            seed=config.seed,
            evaluated_only=training_set.superseded,
        ),
        plan=RunPlan.from_settings(
            project=project,
            project_settings=project_settings,
            # Superseded targets too: a contradiction is reported whichever side is trained.
            targets=training_set.usable,
        ).model_dump(mode="json"),
        # What was left out of this run and why, next to the eval results the worker adds.
        metrics={"exclusions": training_set.as_json()},
    )
    run.targets.set(training_set.usable)
    jobs.enqueue_on_commit(jobs.RUN_TRAINING, run.pk)
    return run


def split_data(
    *,
    project: Project,
    targets: list[DistillationTarget],
    held_out_fraction: float,
    seed: int,
    evaluated_only: Sequence[DistillationTarget] = (),
) -> dict:
    """What the run trains on, what it holds out, what guards it and what judges it.

    - train: approved targets, less held-out feedback (a share of each kind of feedback with
      checks and no correction: a reviewer's correction is always learned);
    - held out besides: the feedback of `evaluated_only` (superseded targets, dataset.py) whose
      every target is among them: evaluated as what the serving adapter must keep;
    - replay: the shipped general prompts (the base's own answers to them) and recent good
      traces, the forgetting guard's data;
    - regression: general facts the base answers right, and the same good traces (drift).
    """
    held_out = held_out_feedback(
        {
            target.feedback_id: target.feedback.text
            for target in targets
            if target.feedback.checks and not target.feedback.correction
        },
        fraction=held_out_fraction,
        seed=seed,
    )
    trained_feedback = {target.feedback_id for target in targets}
    held_out |= {t.feedback_id for t in evaluated_only if t.feedback_id not in trained_feedback}
    trace_ids = {target.feedback.trace_id for target in [*targets, *evaluated_only]}
    good = good_trace_ids(project, exclude_trace_ids=trace_ids)
    return {
        "train_target_ids": [t.pk for t in targets if t.feedback_id not in held_out],
        "held_out_feedback_ids": sorted(held_out),
        "replay": {"general_prompts": len(REPLAY_PROMPTS), "good_trace_ids": good},
        "regression": {"general_facts": len(GENERAL_REGRESSION_PROMPTS), "good_trace_ids": good},
    }


def request_cancel(*, run: TrainingRun) -> None:
    """Queued runs stop at once; running ones where their worker next looks: the end of the
    build, the next training step, the next candidate's evaluation, or the route's change."""
    try:
        move(run.pk, source=RunStatus.QUEUED, target=RunStatus.CANCELLED)
    except TransitionRefused:
        TrainingRun.objects.filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES).update(
            cancel_requested=True
        )


def fail_stale_runs(*, project: Project | None = None) -> int:
    """Runs whose worker stopped reporting are failed, never left 'running' forever."""
    stale = TrainingRun.objects.filter(_stale(), status__in=ACTIVE_RUN_STATUSES).exclude(
        status=RunStatus.QUEUED
    )
    if project is not None:
        stale = stale.filter(project=project)
    return stale.update(
        status=RunStatus.FAILED,
        error="the worker stopped reporting (killed or lost); start the run again",
        finished_at=timezone.now(),
    )


def is_presumed_dead(run: TrainingRun) -> bool:
    """For pages: an active run whose worker stopped reporting (read only, nothing written)."""
    last_sign_of_life = run.heartbeat_at or run.started_at
    return (
        run.status in ACTIVE_RUN_STATUSES
        and run.status != RunStatus.QUEUED
        and last_sign_of_life is not None
        and last_sign_of_life < _stale_cutoff()
    )


def resend_lost_work() -> dict[str, int]:
    """Send again what a crash or a lost enqueue left behind; a worker calls this on start.

    Runs whose worker died while building or training are sent again and resume from their
    last checkpoint; ones that died while evaluating or deploying are failed (their adapter
    may be half registered). An enqueue happens after its transaction commits, so a broker that
    was down, or lost its queues, leaves queued runs and open feedback with no message: they are
    sent again. Both tasks claim their work, so a message sent twice costs only a no-op.
    """
    failed = (
        TrainingRun.objects.filter(_stale())
        .filter(status__in=(RunStatus.EVALUATING, RunStatus.DEPLOYING))
        .update(
            status=RunStatus.FAILED,
            error="the worker stopped reporting while evaluating or deploying; start it again",
            finished_at=timezone.now(),
        )
    )
    resumable = TrainingRun.objects.filter(_stale()).filter(
        status__in=(RunStatus.BUILDING, RunStatus.TRAINING)
    )
    runs = [
        *TrainingRun.objects.filter(status=RunStatus.QUEUED).values_list("pk", flat=True),
        *resumable.values_list("pk", flat=True),
    ]
    for run_id in runs:
        jobs.enqueue(jobs.RUN_TRAINING, run_id)
    feedback_ids = list(
        Feedback.objects.filter(status=FeedbackStatus.OPEN, targets__isnull=True).values_list(
            "pk", flat=True
        )
    )
    for feedback_id in feedback_ids:
        jobs.enqueue(jobs.PROPOSE_TARGETS, feedback_id)
    return {"failed_runs": failed, "runs": len(runs), "feedback": len(feedback_ids)}
