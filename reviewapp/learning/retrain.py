"""What a claimed run does, in order: build its data from the split fixed at creation, train
(resuming from a checkpoint if an earlier worker died), evaluate, register the adapter, gate,
deploy. Every status change goes through the state machine (runs.move): a refused move means
the run was cancelled or failed meanwhile, and the work stops there. A cancel ends the run
`cancelled` in any phase, routing untouched (runs.py says where the worker looks for it).
"""

import json
import logging
import shutil
import threading
import time
import traceback
from pathlib import Path

import httpx
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from reviewapp.learning.deploy import deploy_adapter, unload_everywhere
from reviewapp.learning.models import (
    ACTIVE_RUN_STATUSES,
    Adapter,
    DistillationTarget,
    RunStatus,
    TrainingRun,
)
from reviewapp.learning.plan import run_plan
from reviewapp.learning.runs import (
    TransitionRefused,
    end_cancelled,
    fail,
    move,
    stop_if_cancel_requested,
)
from reviewapp.learning.selectors import final_answer, tags_by_trace
from reviewapp.traces.models import Trace
from training.config import TrainingConfig

logger = logging.getLogger(__name__)

# Progress is written at most this often; more would only load the database.
PROGRESS_INTERVAL_S = 1.0
# One greedy reply of up to MAX_EVAL_TOKENS on a busy CPU server, all items in flight at once.
EVALUATION_TIMEOUT_S = 300.0


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
    from training.adapters import write_adapter
    from training.base_models import resolve_base_model
    from training.candidates import choose_candidate
    from training.replay import base_replay_examples
    from training.trainer import add_lora, checkpoint_loss_curve, load_base_model, train

    project = run.project
    config = TrainingConfig.from_json(json.dumps(run.config))
    split = run.data_split
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
    tools = _tools_by_trace([*targets, *held_out])
    good_traces = _good_traces(split["replay"]["good_trace_ids"])

    model_dir = resolve_base_model(project.base_model, Path(settings.MODEL_CACHE_DIR))
    base, tokenizer = load_base_model(model_dir, config)
    replay = _replay_examples(
        base_replay_examples(base, tokenizer, cache_dir=Path(settings.MODEL_CACHE_DIR) / "replay"),
        good_traces,
        config.replay_examples,
    )
    model = add_lora(base, config)
    move(run.pk, source=RunStatus.BUILDING, target=RunStatus.TRAINING)
    checkpoints = checkpoint_dir(run)
    resume_from = _latest_checkpoint(checkpoints)
    reporter = _RunReporter(run.pk)
    if resume_from is not None:  # the live curve continues the dead worker's
        reporter.loss_curve = [round(loss, 5) for loss in checkpoint_loss_curve(resume_from)]
    result = train(
        model,
        tokenizer,
        config,
        **_training_data(config, targets, tools),
        replay=replay,
        on_progress=reporter.progress,
        should_stop=reporter.should_stop,
        checkpoint_dir=checkpoints if config.save_every_steps else None,
        resume_from=resume_from,
    )
    if result.stopped:  # cancelled, or failed as stale meanwhile
        raise TransitionRefused(f"run {run.pk} stopped training")

    move(run.pk, source=RunStatus.TRAINING, target=RunStatus.EVALUATING)

    def evaluate() -> dict:
        stop_if_cancel_requested(run.pk)  # a cancel stops the run between candidates
        return _evaluate(
            model, tokenizer, targets, held_out, tools, good_traces, base_side, replier
        )

    base_side: dict = {}  # the base's replies, answered once for every candidate
    with httpx.Client(timeout=EVALUATION_TIMEOUT_S) as client:
        replier, evaluated_on = _evaluation_replier(run, model_dir, tokenizer, client)
        report, candidates = choose_candidate(
            model,
            config,
            result,
            evaluate=evaluate,
            thresholds=run_plan(run).gate,
        )
    stop_if_cancel_requested(run.pk)  # before an adapter is written for a cancelled run
    metrics = {
        # What was stored when the run was created (the training-data accounting) stays.
        **TrainingRun.objects.values_list("metrics", flat=True).get(pk=run.pk),
        **report,
        "candidates": candidates,
        "evaluated_on": dict(evaluated_on),
        "train": {
            "steps": result.steps,
            "chosen_step": next(c["step"] for c in candidates if c["chosen"]),
            "tokens": result.tokens,
            "seconds": round(result.seconds, 1),
            "skipped": result.skipped,
            "targets": len(targets),
            "replay_examples": len(replay),
        },
    }
    shutil.rmtree(checkpoints, ignore_errors=True)

    with transaction.atomic():
        latest = Adapter.objects.filter(project=project).aggregate(latest=Max("version"))
        version = (latest["latest"] or 0) + 1
        name = f"{project.slug}-v{version}"
        info = write_adapter(
            model,
            Path(settings.ADAPTERS_DIR),
            name,
            config,
            [target.pk for target in targets],
            extra={"base_model": project.base_model, "run_id": run.pk},
        )
        adapter = Adapter.objects.create(
            project=project,
            version=version,
            name=name,
            path=str(info.path),
            base_model=project.base_model,
            checksum=info.checksum,
            run=run,
            eval_results=metrics,
        )
        TrainingRun.objects.filter(pk=run.pk).update(metrics=metrics, loss_curve=result.loss_curve)
    return _gate_and_deploy(run, adapter, metrics)


def _training_data(config: TrainingConfig, targets: list, tools: dict) -> dict:
    """sft: (context, approved reply) examples; distill: (student, teacher context) items, the
    teacher shown the feedback the way `teacher_prompt` says."""
    from training.targets import hint_context, rewrite_context
    from training.trainer import DistillItem, Example

    if config.mode == "sft":
        return {
            "examples": [
                Example(t.student_context, t.target, tools[t.feedback.trace_id]) for t in targets
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
        items.append(
            DistillItem(target.student_context, teacher_context, tools[target.feedback.trace_id])
        )
    return {"items": items}


def _replay_examples(general: list, good_traces: list[tuple[Trace, tuple]], limit: int) -> list:
    """Good traces' answers first (this project's own traffic), then the base's general ones."""
    from training.trainer import Example

    own = [Example(context, answer, tools) for _, (context, answer, tools) in good_traces]
    return [*own, *general][:limit]


def _good_traces(trace_ids: list[int]) -> list[tuple[Trace, tuple]]:
    traces = Trace.objects.filter(pk__in=trace_ids).order_by("-id")
    return [(trace, answer) for trace in traces if (answer := final_answer(trace)) is not None]


def _tools_by_trace(targets: list) -> dict[int, list[dict] | None]:
    tools: dict[int, list[dict] | None] = {}
    for target in targets:
        trace = target.feedback.trace
        if trace.pk not in tools:
            tools[trace.pk] = trace.body_json()["tools"] or None
    return tools


def _latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint an earlier attempt of this run left behind."""
    if not directory.is_dir():
        return None
    complete = sorted(path for path in directory.glob("step-*") if path.is_dir())
    return complete[-1] if complete else None


def _evaluation_replier(run: TrainingRun, model_dir: Path, tokenizer, client: httpx.Client):
    """The evaluation's greedy replies come from the first of the run's model servers that
    answers and serves its base model (its candidates loaded there under names no route
    knows), else from this process. Returns the replier and the record of what answered
    (filled in as it answers)."""
    from training.repliers import InProcessReplier, ServerReplier

    project = run.project
    in_process = InProcessReplier(tokenizer.eos_token_id)
    served_name = project.upstream_model or project.served_model
    for url in run_plan(run).model_servers(project):
        try:
            served = client.get(f"{url}/models", timeout=5).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            continue
        # The served name alone could be another model: the weights' directory must match too.
        roots = {entry.get("root") for entry in served if entry.get("id") == served_name}
        if not any(_same_model(root, model_dir, project.base_model) for root in roots):
            continue
        server = ServerReplier(
            client,
            url,
            base_model=served_name,
            scratch_dir=Path(settings.ADAPTERS_DIR) / ".evaluation",
            eos_token_id=tokenizer.eos_token_id,
            fallback=in_process,
            name_prefix=f"eval-run{run.pk}",
        )
        return server, server.record
    return in_process, {"server": "", "error": "no model server serving the base model answered"}


def _same_model(root: str | None, model_dir: Path, base_model: str) -> bool:
    """vLLM's `root` is the --model it was started with: the base model's name or a directory
    (the same one, or a copy of it under the same name on the server's machine)."""
    if not root:
        return False
    return root == base_model or Path(root).name == Path(model_dir).resolve().name


def _evaluate(model, tokenizer, targets, held_out, tools, good_traces, base_cache, replier) -> dict:
    """Before/after on the feedback (trained and held out) and on the regression prompts."""
    from training.eval_sets import general_regression_items
    from training.evaluation import evaluate_adapter
    from training.targets import hint_context

    first_per_feedback: dict[int, DistillationTarget] = {}
    for target in [*targets, *held_out]:
        first_per_feedback.setdefault(target.feedback_id, target)
    held_out_ids = {target.feedback_id for target in held_out}
    tags = tags_by_trace({target.feedback.trace_id for target in first_per_feedback.values()})
    feedback_items = [
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
            "tools": tools[target.feedback.trace_id],
        }
        for target in first_per_feedback.values()
    ]
    trace_items = [
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
    return evaluate_adapter(
        model,
        tokenizer,
        feedback_items,
        general_regression_items() + trace_items,
        base_cache,
        replier=replier,
    )


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


class _RunReporter:
    """Writes a run's progress and heartbeat as it trains, and reads its cancel flag."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.last_write = 0.0
        self.loss_curve: list[float] = []

    def progress(self, step: int, total: int, loss: float, tokens_per_s: float, eta_s: float):
        self.loss_curve.append(round(float(loss), 5))
        now = time.monotonic()
        if now - self.last_write < PROGRESS_INTERVAL_S and step < total:
            return
        self.last_write = now
        TrainingRun.objects.filter(pk=self.run_id, status=RunStatus.TRAINING).update(
            progress={
                "step": step,
                "total_steps": total,
                "loss": round(float(loss), 5),
                "tokens_per_s": round(tokens_per_s, 1),
                "eta_s": round(eta_s, 1),
            },
            loss_curve=self.loss_curve,
            heartbeat_at=timezone.now(),
        )

    def should_stop(self) -> bool:
        """Cancelled, or no longer training (failed as stale meanwhile): stop at this step."""
        return not TrainingRun.objects.filter(
            pk=self.run_id, status=RunStatus.TRAINING, cancel_requested=False
        ).exists()


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
