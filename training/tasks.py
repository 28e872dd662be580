"""Celery tasks: the only module of training/ that touches Django models.

Tasks take ids, claim their work with a conditional UPDATE (so a second delivery does nothing),
call the pure training code, and record what happened. Training is never retried silently: a
failure ends the run in `failed` with the reason, where a person sees it.
"""

import json
import logging
import socket
import threading
import time
import traceback
from pathlib import Path

import httpx
from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from reviewapp.models import (
    ACTIVE_RUN_STATUSES,
    Adapter,
    DistillationTarget,
    Feedback,
    FeedbackStatus,
    RunStatus,
    TargetState,
    Trace,
    TraceTag,
    TrainingRun,
)
from training.config import TrainingConfig

# torch and transformers are imported inside the tasks: the web process imports this module to
# enqueue work and should not pay for them.

logger = logging.getLogger(__name__)

# Progress is written at most this often; more would only load the database.
PROGRESS_INTERVAL_S = 1.0
TARGETS_PER_FEEDBACK = 4


def _teacher_for(project):
    """vLLM when it answers (fast, batched n), else the base model in this process."""
    from training.targets import VllmTeacher

    url = (project.upstream_url or settings.VLLM_URL).rstrip("/")
    client = httpx.Client(timeout=120)
    try:
        if client.get(f"{url}/models", timeout=3).status_code == 200:
            return VllmTeacher(url, project.upstream_model or project.served_model, client)
    except httpx.HTTPError:
        pass
    from training.base_models import resolve_base_model
    from training.targets import TransformersTeacher
    from training.trainer import load_base_model

    model_dir = resolve_base_model(project.base_model, Path(settings.MODEL_CACHE_DIR))
    model, tokenizer = load_base_model(model_dir, TrainingConfig())
    return TransformersTeacher(model, tokenizer)


@shared_task(name="training.propose_targets", acks_late=True)
def propose_targets_for_feedback(feedback_id: int) -> int:
    """Targets for one feedback: its correction as is, else the teacher's revisions."""
    from training.targets import (
        hint_context,
        propose_targets,
        resolve_turn,
        rewrite_context,
        student_context,
    )

    feedback = Feedback.objects.select_related("trace__project").filter(pk=feedback_id).first()
    if feedback is None or feedback.targets.exists():
        return 0  # deleted, or a second delivery
    body = feedback.trace.body_json()
    messages = body["messages"]
    turn = resolve_turn(messages, feedback.turn)
    context = student_context(messages, turn)
    project = feedback.trace.project
    policy = (project.settings.get("training") or {}).get("teacher_prompt", "hint")
    auto_approve = project.settings.get("auto_approve") == "checks_pass"
    if feedback.correction:
        rows = [
            DistillationTarget(
                feedback=feedback,
                turn=turn,
                source="correction",
                student_context=context,
                original=messages[turn],
                target=feedback.correction,
                state=TargetState.APPROVED,  # a reviewer wrote it: the strongest target
            )
        ]
    else:
        proposals = propose_targets(
            _teacher_for(project),
            messages,
            turn,
            feedback.text,
            feedback.checks,
            prompt=policy,
            n=TARGETS_PER_FEEDBACK,
            tools=body["tools"] or None,
        )
        rows = [
            DistillationTarget(
                feedback=feedback,
                turn=turn,
                source=policy,
                student_context=context,
                teacher_context=(
                    rewrite_context(context, messages[turn], feedback.text)
                    if policy == "rewrite"
                    else hint_context(context, feedback.text)
                ),
                original=messages[turn],
                target=proposal.message,
                passes_checks=proposal.passes_checks,
                state=(
                    TargetState.APPROVED
                    if auto_approve and proposal.passes_checks and feedback.checks
                    else TargetState.PROPOSED
                ),
            )
            for proposal in proposals
        ]
    with transaction.atomic():
        # Two deliveries can overlap (the broker presumed a slow worker dead): the row lock
        # makes the later one see the earlier one's targets and store none of its own.
        Feedback.objects.select_for_update().filter(pk=feedback.pk).first()
        if feedback.targets.exists():
            return 0
        DistillationTarget.objects.bulk_create(rows)
        Feedback.objects.filter(pk=feedback.pk).update(status=FeedbackStatus.USED)
    return len(rows)


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
        TrainingRun.objects.filter(pk=self.run_id).update(
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
        return TrainingRun.objects.filter(pk=self.run_id, cancel_requested=True).exists()


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


def _set_status(run_id: int, status: str, **fields) -> None:
    TrainingRun.objects.filter(pk=run_id).update(
        status=status, heartbeat_at=timezone.now(), **fields
    )


def _next_adapter_name(project) -> tuple[int, str]:
    latest = Adapter.objects.filter(project=project).aggregate(latest=Max("version"))["latest"]
    version = (latest or 0) + 1
    return version, f"{project.slug}-v{version}"


@shared_task(name="training.run_training", queue="gpu", acks_late=True)
def run_training(run_id: int) -> str:
    """Build the data, train the adapter, write it immutably, evaluate it."""
    claimed = TrainingRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.BUILDING,
        started_at=timezone.now(),
        heartbeat_at=timezone.now(),
        worker=socket.gethostname()[:200],
    )
    if not claimed:
        return "not claimed"  # cancelled, or delivered a second time
    run = TrainingRun.objects.select_related("project").get(pk=run_id)
    try:
        with _Heartbeat(run_id):
            return _train_and_write(run)
    except Exception as error:
        logger.exception("training run %s failed", run_id)
        _set_status(
            run_id,
            RunStatus.FAILED,
            error=f"{type(error).__name__}: {error}"[:2000],
            log=traceback.format_exc()[-20000:],
            finished_at=timezone.now(),
        )
        return "failed"


def _train_and_write(run: TrainingRun) -> str:
    from training.adapters import write_adapter
    from training.base_models import resolve_base_model
    from training.eval_sets import held_out_feedback
    from training.targets import hint_context
    from training.trainer import DistillItem, Example, add_lora, load_base_model, train

    project = run.project
    config = TrainingConfig.from_json(json.dumps(run.config))
    targets = list(run.targets.select_related("feedback__trace").order_by("id"))
    tools_by_trace = {}
    for target in targets:
        trace = target.feedback.trace
        if trace.pk not in tools_by_trace:
            tools_by_trace[trace.pk] = trace.body_json()["tools"] or None
    # Only feedback with checks can show generalisation, and a reviewer's correction is always
    # learned: the rest may be held out.
    held_out_ids = held_out_feedback(
        {
            target.feedback_id: target.feedback.text
            for target in targets
            if target.feedback.checks and not target.feedback.correction
        },
        fraction=config.held_out_fraction,
        seed=config.seed,
    )
    trained = [target for target in targets if target.feedback_id not in held_out_ids]
    examples, items = [], []
    for target in trained:
        tools = tools_by_trace[target.feedback.trace_id]
        if config.mode == "sft":
            examples.append(Example(target.student_context, target.target, tools))
        else:
            teacher_context = hint_context(target.student_context, target.feedback.text)
            items.append(DistillItem(target.student_context, teacher_context, tools))

    model_dir = resolve_base_model(project.base_model, Path(settings.MODEL_CACHE_DIR))
    base, tokenizer = load_base_model(model_dir, config)
    model = add_lora(base, config)
    _set_status(run.pk, RunStatus.TRAINING)
    reporter = _RunReporter(run.pk)
    result = train(
        model,
        tokenizer,
        config,
        examples=examples,
        items=items,
        on_progress=reporter.progress,
        should_stop=reporter.should_stop,
    )
    if result.stopped:
        _set_status(run.pk, RunStatus.CANCELLED, finished_at=timezone.now())
        return "cancelled"

    _set_status(run.pk, RunStatus.EVALUATING)
    metrics = {
        # What was stored when the run was created (e.g. the training-data accounting) stays.
        **TrainingRun.objects.values_list("metrics", flat=True).get(pk=run.pk),
        **_evaluate(model, tokenizer, project, targets, held_out_ids, tools_by_trace),
        "train": {
            "steps": result.steps,
            "tokens": result.tokens,
            "seconds": round(result.seconds, 1),
            "skipped": result.skipped,
            "targets": len(trained),
        },
    }

    version, name = _next_adapter_name(project)
    info = write_adapter(
        model,
        Path(settings.ADAPTERS_DIR),
        name,
        config,
        [target.pk for target in trained],
        extra={"base_model": project.base_model, "run_id": run.pk},
    )
    with transaction.atomic():
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
        _set_status(run.pk, RunStatus.EVALUATING, metrics=metrics, loss_curve=result.loss_curve)
    return _gate_and_deploy(run, adapter, metrics)


# Replies in the gate are greedy and short: enough to see a prefix, a length or a fact.
EVAL_MAX_NEW_TOKENS = 48
GOOD_TRACES_FOR_REGRESSION = 8


def _evaluate(model, tokenizer, project, targets, held_out_ids, tools_by_trace) -> dict:
    """Before/after on the feedback (trained and held out) and on the regression prompts."""
    from training.eval_sets import general_regression_items
    from training.evaluation import compare_replies, summarize
    from training.targets import hint_context

    first_target_per_feedback = {}
    for target in targets:
        first_target_per_feedback.setdefault(target.feedback_id, target)
    feedback_items = [
        {
            "feedback_id": target.feedback_id,
            "target_id": target.pk,
            "trace_id": target.feedback.trace_id,
            "held_out": target.feedback_id in held_out_ids,
            "context": target.student_context,
            "teacher_context": hint_context(target.student_context, target.feedback.text),
            "checks": target.feedback.checks,
            "tools": tools_by_trace[target.feedback.trace_id],
        }
        for target in first_target_per_feedback.values()
    ]
    trace_ids = {target.feedback.trace_id for target in targets}
    regression_items = general_regression_items() + _good_trace_items(project, trace_ids)
    inputs = feedback_items + regression_items
    results = compare_replies(model, tokenizer, inputs, max_new_tokens=EVAL_MAX_NEW_TOKENS)

    # Stored results keep what a reader needs (ids, prompt, replies, checks, status), not contexts.
    def stored(item: dict, result: dict) -> dict:
        kept = {key: item[key] for key in ("feedback_id", "target_id", "trace_id") if key in item}
        if "prompt" in item:
            kept.update(source=item["source"], prompt=item["prompt"])
        return {**kept, **result}

    rows = [stored(item, result) for item, result in zip(inputs, results, strict=True)]
    feedback_rows, regression_rows = rows[: len(feedback_items)], rows[len(feedback_items) :]
    pairs = list(zip(feedback_rows, feedback_items, strict=True))
    trained_rows = [row for row, item in pairs if not item["held_out"]]
    held_out_rows = [row for row, item in pairs if item["held_out"]]
    drifts = [row["drift"] for row in regression_rows if "drift" in row]
    report = {
        "feedback_items": summarize(trained_rows),
        "items": trained_rows,
        "per_tag": _per_tag(trained_rows),
        "regression": {
            "summary": summarize(regression_rows),
            "mean_drift": round(sum(drifts) / len(drifts), 4) if drifts else None,
            "items": regression_rows,
        },
    }
    if held_out_rows:
        report["held_out"] = {"summary": summarize(held_out_rows), "items": held_out_rows}
    return report


def _good_trace_items(project, exclude_trace_ids: set[int]) -> list[dict]:
    """Recent traces that went well (the task succeeded with no complaint, or a reviewer rated
    them up): the adapter should still be willing to give their final text answer."""
    good = (
        Trace.objects.filter(project=project)
        .filter(Q(success=True, feedback__isnull=True) | Q(feedback__rating__gt=0))
        .exclude(feedback__rating__lte=0)
        .exclude(pk__in=exclude_trace_ids)
        .distinct()
        .order_by("-id")[: GOOD_TRACES_FOR_REGRESSION * 2]
    )
    items = []
    for trace in good:
        body = trace.body_json()
        messages = body["messages"]
        for turn in range(len(messages) - 1, -1, -1):
            message = messages[turn]
            if (
                message["role"] == "assistant"
                and message.get("content")
                and not message.get("tool_calls")
            ):
                items.append(
                    {
                        "source": "trace",
                        "trace_id": trace.pk,
                        "prompt": trace.preview,
                        "context": messages[:turn],
                        "reference": message,
                        "tools": body["tools"] or None,
                    }
                )
                break
        if len(items) == GOOD_TRACES_FOR_REGRESSION:
            break
    return items


def _per_tag(rows: list[dict]) -> dict[str, dict[str, int]]:
    from training.evaluation import STATUSES

    tags_by_trace: dict[int, set[str]] = {}
    for trace_id, tag_name in TraceTag.objects.filter(
        trace_id__in={row["trace_id"] for row in rows}
    ).values_list("trace_id", "tag__name"):
        tags_by_trace.setdefault(trace_id, set()).add(tag_name)
    per_tag: dict[str, dict[str, int]] = {}
    for row in rows:
        for tag_name in tags_by_trace.get(row["trace_id"], ()):
            counts = per_tag.setdefault(tag_name, dict.fromkeys(STATUSES, 0))
            counts[row["status"]] += 1
    return per_tag


def _gate_and_deploy(run: TrainingRun, adapter: Adapter, metrics: dict) -> str:
    """Only an adapter that passes the gate serves traffic; a failed deploy changes no route."""
    from reviewapp.services.deploy import deploy_adapter
    from training.deploy import DeployError
    from training.gate import GateThresholds, gate_decision

    project = run.project
    passes, reason = gate_decision(
        metrics, GateThresholds.from_settings(project.settings.get("gate"))
    )
    metrics = {**metrics, "gate": {"passed": passes, "reason": reason}}
    if not passes:
        _set_status(
            run.pk, RunStatus.GATE_FAILED, metrics=metrics, error=reason, finished_at=timezone.now()
        )
        return "gate failed"
    if not project.settings.get("auto_deploy", True):
        _set_status(run.pk, RunStatus.TRAINED, metrics=metrics, finished_at=timezone.now())
        return "trained"
    _set_status(run.pk, RunStatus.DEPLOYING, metrics=metrics)
    try:
        deploy_adapter(adapter=adapter, share=int(project.settings.get("canary_share", 100)))
    except (DeployError, ValueError) as error:
        _set_status(
            run.pk,
            RunStatus.DEPLOY_FAILED,
            error=f"deploy failed, routing unchanged: {error}"[:2000],
            finished_at=timezone.now(),
        )
        return "deploy failed"
    _set_status(run.pk, RunStatus.DEPLOYED, finished_at=timezone.now())
    return "deployed"
