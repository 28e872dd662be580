"""What a claimed run does, in order: build its training job from what was frozen at creation,
run it (training/job.py: train, resuming from a checkpoint if an earlier worker died, evaluate,
choose a candidate, write the adapter), register the adapter, gate, deploy. Every status change
goes through the state machine (runs.move): a refused move means the run was cancelled or failed
meanwhile, and the work stops there. A cancel ends the run `cancelled` in any phase, routing
untouched (runs.py says where the worker looks for it).
"""

import json
import logging
import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from reviewapp.learning.deploy import deploy_adapter, unload_everywhere
from reviewapp.learning.lessons import record_lessons
from reviewapp.learning.models import (
    ACTIVE_RUN_STATUSES,
    Adapter,
    DistillationTarget,
    RunStatus,
    TrainingRun,
)
from reviewapp.learning.plan import run_plan
from reviewapp.learning.proposals import fit_worked_examples
from reviewapp.learning.runs import TransitionRefused, end_cancelled, fail, move
from reviewapp.learning.selectors import final_answer, tags_by_trace
from reviewapp.traces.models import Trace, tools_shown
from training.config import TrainingConfig
from training.eval_sets import feedback_kind

# The rest of training/ loads torch, transformers and peft (9 s here): functions import it
# where they train, so a process that imports this module and never trains (a default-queue
# worker registers every task) does not pay for it.
if TYPE_CHECKING:
    from training.job import Phase, Progress, TrainingJob

logger = logging.getLogger(__name__)

# Progress is written at most this often; more would only load the database.
PROGRESS_INTERVAL_S = 1.0


def execute_run(run: TrainingRun) -> str:
    """Run a claimed run to its end; returns the status it ended in (or why it stopped)."""
    try:
        with _Heartbeat(run.pk):
            return _execute(run)
    except TransitionRefused:
        if end_cancelled(run.pk):  # a person's cancel refused the move: it ends here
            shutil.rmtree(checkpoint_dir(run), ignore_errors=True)
            return RunStatus.CANCELLED
        return "superseded"  # failed meanwhile: what happened stays as it is
    except Exception as error:
        logger.exception("training run %s failed", run.pk)
        fail(run.pk, error=f"{type(error).__name__}: {error}", log=traceback.format_exc())
        return RunStatus.FAILED


def checkpoint_dir(run: TrainingRun) -> Path:
    return Path(settings.ADAPTERS_DIR) / ".checkpoints" / f"run-{run.pk}"


def _execute(run: TrainingRun) -> str:
    from training.job import run_job

    callbacks = _RunCallbacks(run)
    outcome = run_job(_training_job(run), callbacks)
    if outcome.stopped:  # cancelled, or failed as stale meanwhile
        raise TransitionRefused(f"run {run.pk} stopped while {callbacks.status}")
    callbacks.end_phase()
    metrics = {
        # What was stored when the run was created (the training-data accounting) stays.
        **TrainingRun.objects.values_list("metrics", flat=True).get(pk=run.pk),
        **outcome.metrics,
        "phase_seconds": callbacks.phase_seconds,
    }
    with transaction.atomic():
        adapter = Adapter.objects.create(
            project=run.project,
            version=callbacks.adapter_version,
            name=outcome.adapter.path.name,
            path=str(outcome.adapter.path),
            base_model=run.project.base_model,
            checksum=outcome.adapter.checksum,
            run=run,
            eval_results=metrics,
        )
        TrainingRun.objects.filter(pk=run.pk).update(metrics=metrics, loss_curve=outcome.loss_curve)
        # The ledger keeps this version's adherence to every lesson, refused or not.
        record_lessons(adapter=adapter, report=metrics, passed=outcome.chosen["passed"])
    return _gate_and_deploy(run, adapter, metrics)


def _training_job(run: TrainingRun) -> "TrainingJob":
    """The run's job: its config, data split and plan, as frozen when it was created."""
    from training.job import ServingAdapter, TrainingJob
    from training.repliers import ModelServers
    from training.trainer import Example

    project = run.project
    config = TrainingConfig.from_json(json.dumps(run.config))
    split = run.data_split
    plan = run_plan(run)
    targets = list(
        DistillationTarget.objects.filter(pk__in=split["train_target_ids"])
        .select_related("feedback__trace")
        .order_by("id")
    )
    held_out = list(
        run.targets.filter(feedback_id__in=split["held_out_feedback_ids"])
        .select_related("feedback__trace")
        .order_by("id")
    )
    tools = _tools_shown_by_target([*targets, *held_out])
    good_traces = _good_traces(split["replay"]["good_trace_ids"])
    serving = plan.serving_adapter
    return TrainingJob(
        config=config,
        base_model=project.base_model,
        model_cache_dir=Path(settings.MODEL_CACHE_DIR),
        checkpoint_dir=checkpoint_dir(run),
        adapter_root=Path(settings.ADAPTERS_DIR),
        thresholds=plan.gate,
        **_training_data(config, targets, tools),
        # This project's own traffic first, then the base's general answers.
        replay=[Example(context, answer, tools) for _, (context, answer, tools) in good_traces],
        lessons=_lessons(targets, tools),
        feedback_items=_feedback_items(
            targets, held_out, tools, _lessons_learned_by(serving.name if serving else None)
        ),
        regression_items=_trace_items(good_traces),
        target_ids=[target.pk for target in targets],
        lineage={"base_model": project.base_model, "run_id": run.pk},
        # The first that answers and serves this run's base model writes the evaluation's
        # greedy replies, its candidates loaded there under names no route knows.
        evaluation_servers=ModelServers(
            urls=tuple(plan.model_servers(project)),
            served_model=project.upstream_model or project.served_model,
            scratch_dir=Path(settings.ADAPTERS_DIR) / ".evaluation",
            name_prefix=f"eval-run{run.pk}",
        ),
        serving_adapter=(
            ServingAdapter(name=serving.name, version=serving.version, path=Path(serving.path))
            if serving
            else None
        ),
    )


def _lessons_learned_by(adapter_name: str | None) -> set[str]:
    """The lessons (feedback kinds) the named adapter's run trained on."""
    run = TrainingRun.objects.filter(adapter__name=adapter_name).first() if adapter_name else None
    if run is None:
        return set()
    texts = DistillationTarget.objects.filter(
        pk__in=run.data_split.get("train_target_ids") or []
    ).values_list("feedback__text", flat=True)
    return {feedback_kind(text) for text in texts}


def _training_data(config: TrainingConfig, targets: list, tools: dict) -> dict:
    """sft: (context, approved reply) examples, each with the answer it replaced where that
    differs (a correction's or a revision's `original`: the preference term's pair) and its
    lesson (the job keeps the pair per lesson); distill:
    (student, teacher context) items, the teacher shown the feedback the way `teacher_prompt`
    says."""
    from training.targets import hint_context, rewrite_context
    from training.trainer import DistillItem, Example

    if config.mode == "sft":
        return {
            "examples": [
                Example(
                    t.student_context,
                    t.target,
                    tools[t.pk],
                    rejected=t.original if t.original and t.original != t.target else None,
                    lesson=t.feedback.text,
                )
                for t in targets
            ]
        }
    items = []
    for target in targets:
        feedback = target.feedback.text
        if config.teacher_prompt == "rewrite" and target.original:
            teacher_context = rewrite_context(target.student_context, target.original, feedback)
        elif target.source == "hint" and target.teacher_context:
            # As the teacher saw it when it proposed this target: worked examples included.
            teacher_context = target.teacher_context
        else:
            teacher_context = hint_context(target.student_context, feedback)
        items.append(DistillItem(target.student_context, teacher_context, tools[target.pk]))
    return {"items": items}


def _good_traces(trace_ids: list[int]) -> list[tuple[Trace, tuple]]:
    traces = Trace.objects.filter(pk__in=trace_ids).order_by("-id")
    return [(trace, answer) for trace in traces if (answer := final_answer(trace)) is not None]


def _lessons(targets: list, tools: dict) -> list:
    """The lessons the run trains on turns served without tools, oldest first, as the teacher is
    shown them: the feedback's text with those of its targets that fit as worked examples,
    corrections first. With the guard's reference "lessons", the teacher shown them all
    answers the general replay prompts. Tool lessons are about turns no general prompt has."""
    from training.targets import LessonHint, WorkedExample

    by_kind: dict[str, list] = {}
    for target in targets:  # in id order: a lesson's place is its first target
        if not tools[target.pk]:
            by_kind.setdefault(feedback_kind(target.feedback.text), []).append(target)
    return [
        LessonHint(
            group[0].feedback.text,
            tuple(
                fit_worked_examples(
                    WorkedExample.ending(target.student_context, target.target)
                    for target in sorted(group, key=lambda other: other.source != "correction")
                )
            ),
        )
        for group in by_kind.values()
    ]


def _tools_shown_by_target(targets: list) -> dict[int, list[dict] | None]:
    """Each target's tool definitions as its turn's prompt showed them (traces.tools_shown)."""
    bodies: dict[int, dict] = {}
    tools: dict[int, list[dict] | None] = {}
    for target in targets:
        trace = target.feedback.trace
        if trace.pk not in bodies:
            bodies[trace.pk] = trace.body_json()
        tools[target.pk] = tools_shown(bodies[trace.pk], target.turn)
    return tools


def _feedback_items(
    targets: list, held_out: list, tools: dict, learned_by_serving: set[str]
) -> list[dict]:
    """The evaluation's feedback items: one per feedback, trained or held out, its teacher
    shown the feedback as a hint (how far the student is from following it), its lesson the
    feedback's text (`learned_by_serving`: the kinds the serving adapter trained on)."""
    from training.targets import hint_context

    first_per_feedback: dict[int, DistillationTarget] = {}
    for target in [*targets, *held_out]:
        first_per_feedback.setdefault(target.feedback_id, target)
    held_out_ids = {target.feedback_id for target in held_out}
    tags = tags_by_trace({target.feedback.trace_id for target in first_per_feedback.values()})
    return [
        {
            "feedback_id": target.feedback_id,
            "target_id": target.pk,
            "trace_id": target.feedback.trace_id,
            "held_out": target.feedback_id in held_out_ids,
            "tags": tags.get(target.feedback.trace_id, []),
            "context": target.student_context,
            "teacher_context": hint_context(target.student_context, target.feedback.text),
            "checks": target.feedback.checks,
            "original": target.original,
            "tools": tools[target.pk],
            "lesson": target.feedback.text,
            "learned_by_serving": feedback_kind(target.feedback.text) in learned_by_serving,
        }
        for target in first_per_feedback.values()
    ]


def _trace_items(good_traces: list[tuple[Trace, tuple]]) -> list[dict]:
    """Regression items from good traces: how far the adapter drifts from their answers."""
    return [
        {
            "source": "trace",
            "trace_id": trace.pk,
            "prompt": trace.preview,
            "context": context,
            "reference": answer,
            "original": answer,
            "tools": trace_tools,
        }
        for trace, (context, answer, trace_tools) in good_traces
    ]


def _gate_and_deploy(run: TrainingRun, adapter: Adapter, metrics: dict) -> str:
    """Only an adapter that passes the gate serves traffic; a failed deploy changes no route.

    The gate's decision is the chosen candidate's (made once, in choose_candidate)."""
    from training.deploy import DeployError

    plan = run_plan(run)
    chosen = next(candidate for candidate in metrics["candidates"] if candidate["chosen"])
    passes, reason = chosen["passed"], chosen["reason"]
    metrics = {**metrics, "gate": {"passed": passes, "reason": reason}}
    if not passes:
        move(
            run.pk,
            source=RunStatus.EVALUATING,
            target=RunStatus.GATE_FAILED,
            metrics=metrics,
            error=reason,
        )
        return RunStatus.GATE_FAILED
    if not plan.auto_deploy:
        move(run.pk, source=RunStatus.EVALUATING, target=RunStatus.TRAINED, metrics=metrics)
        return RunStatus.TRAINED
    move(run.pk, source=RunStatus.EVALUATING, target=RunStatus.DEPLOYING, metrics=metrics)
    try:
        deploy_adapter(
            adapter=adapter,
            share=plan.canary_share,
            plan=plan,
            # In the route's transaction: a cancel that came first refuses it, and the route
            # stays as it was; one that comes after finds the run deployed.
            before_route_change=lambda: move(
                run.pk, source=RunStatus.DEPLOYING, target=RunStatus.DEPLOYED
            ),
        )
    except (DeployError, ValueError) as error:
        move(
            run.pk,
            source=RunStatus.DEPLOYING,
            target=RunStatus.DEPLOY_FAILED,
            error=f"deploy failed, routing unchanged: {error}"[:2000],
        )
        return RunStatus.DEPLOY_FAILED
    except TransitionRefused:
        unload_everywhere(adapter=adapter)  # loaded, never routed: the servers drop it
        raise
    return RunStatus.DEPLOYED


class _RunCallbacks:
    """The run's side of its job: moves its status between phases, writes its progress and
    heartbeat, reads its cancel flag, and names its adapter."""

    MOVES: "dict[Phase, tuple[str, str]]" = {
        "training": (RunStatus.BUILDING, RunStatus.TRAINING),
        "evaluating": (RunStatus.TRAINING, RunStatus.EVALUATING),
    }

    def __init__(self, run: TrainingRun) -> None:
        self.run = run
        self.status: str = RunStatus.BUILDING  # the one this worker last moved the run to
        self.last_write = 0.0
        self.adapter_version: int | None = None
        # Seconds each phase took in this worker (a run taken over: since it took over), for
        # the run page: where a retrain's minutes go.
        self.phase_seconds: dict[str, float] = {}
        self.phase_began = time.monotonic()

    def on_phase(self, phase: "Phase") -> None:
        source, target = self.MOVES[phase]
        move(self.run.pk, source=source, target=target)
        self.end_phase()
        self.status = target

    def end_phase(self) -> None:
        now = time.monotonic()
        self.phase_seconds[str(self.status)] = round(now - self.phase_began, 1)
        self.phase_began = now

    def on_progress(self, progress: "Progress") -> None:
        now = time.monotonic()
        if now - self.last_write < PROGRESS_INTERVAL_S and progress.step < progress.total_steps:
            return
        self.last_write = now
        TrainingRun.objects.filter(pk=self.run.pk, status=RunStatus.TRAINING).update(
            progress={
                "step": progress.step,
                "total_steps": progress.total_steps,
                "loss": round(float(progress.loss), 5),
                "tokens_per_s": round(progress.tokens_per_s, 1),
                "eta_s": round(progress.eta_s, 1),
            },
            loss_curve=[round(float(loss), 5) for loss in progress.loss_curve],
            heartbeat_at=timezone.now(),
        )

    def should_stop(self) -> bool:
        """Cancelled, or no longer where this worker moved it (failed as stale meanwhile)."""
        return not TrainingRun.objects.filter(
            pk=self.run.pk, status=self.status, cancel_requested=False
        ).exists()

    def adapter_name(self) -> str:
        project = self.run.project
        latest = Adapter.objects.filter(project=project).aggregate(latest=Max("version"))
        self.adapter_version = (latest["latest"] or 0) + 1
        return f"{project.slug}-v{self.adapter_version}"


class _Heartbeat:
    """Marks a claimed run alive from a thread of its own, so a run is presumed dead only when
    its worker is, not while it loads a model or evaluates (which report no progress)."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.interval = max(1.0, settings.TRAINING_HEARTBEAT_TIMEOUT_SECONDS / 3)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"heartbeat-{run_id}", daemon=True)

    def __enter__(self) -> "_Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)

    def _beat(self) -> None:
        try:
            while not self.stopped.wait(self.interval):
                try:
                    TrainingRun.objects.filter(
                        pk=self.run_id, status__in=ACTIVE_RUN_STATUSES
                    ).update(heartbeat_at=timezone.now())
                except DatabaseError as error:  # a restarting database: beat again later
                    logger.warning("heartbeat of run %s not written: %s", self.run_id, error)
        finally:
            connection.close()  # this thread's own connection
