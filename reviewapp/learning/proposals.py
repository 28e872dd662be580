"""Turning one feedback into distillation targets: its correction as is, else the teacher's
revisions of the turn, best first."""

from collections.abc import Iterable
from pathlib import Path

import httpx
from django.conf import settings
from django.db import transaction

from reviewapp.learning.lessons import earlier_lessons, unkept_lessons
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.projects.models import Project
from reviewapp.projects.outbound import OutboundRefused, check_teacher_url
from reviewapp.projects.project_settings import ProjectSettings, settings_for
from reviewapp.review.feedback import mark_feedback_failed
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.models import tools_shown
from training.config import TrainingConfig
from training.readability import reply_looks_garbled

# The teacher samples this many revisions per request, until one passes the feedback's checks
# or TEACHER_BUDGET samples are spent: the bundled model follows some feedback 1 time in 16.
TEACHER_SAMPLES_PER_ROUND = 4
TEACHER_BUDGET = 16
# How many reviewers' corrections under the same feedback the teacher is shown as worked
# examples: each costs context, and 4 already took the bundled model from 3 to 12 passing
# revisions in 12 (training/targets.WorkedExample).
WORKED_EXAMPLES = 4
# ...and at most this many characters of them in all (tool calls and results included), so a
# trace that fits the model's context still fits with its examples.
WORKED_EXAMPLE_CHARS = 3000


def teacher_for(project: Project, project_settings: ProjectSettings, *, seed: int):
    """The project's teacher endpoint if it has one; else its model server when that answers
    (fast, batched n); else the base model in this process. Its samples are drawn from `seed`
    (the project's training seed), so the same feedback gets the same proposals."""
    from training.targets import VllmTeacher

    teacher = project_settings.teacher
    url = (teacher.url or project.upstream_url or settings.VLLM_URL).rstrip("/")
    model = teacher.model or project.upstream_model or project.served_model
    client = httpx.Client(timeout=120)
    if teacher.url:  # configured on purpose: its failures are reported, not worked around
        # Set when the operator allowed it; asked only while the operator still does.
        url = check_teacher_url(project, teacher.url)
        return VllmTeacher(url, model, client, api_key=teacher.api_key(), seed=seed)
    try:
        if client.get(f"{url}/models", timeout=3).status_code == 200:
            return VllmTeacher(url, model, client, seed=seed)
    except httpx.HTTPError:
        pass
    from training.base_models import resolve_base_model
    from training.targets import TransformersTeacher
    from training.trainer import load_base_model

    model_dir = resolve_base_model(project.base_model, Path(settings.MODEL_CACHE_DIR))
    model, tokenizer = load_base_model(model_dir, TrainingConfig())
    return TransformersTeacher(model, tokenizer, seed=seed)


def worked_examples_for(feedback: Feedback, limit: int = WORKED_EXAMPLES) -> list:
    """Reviewers' corrections of other traces in the project under the same feedback text,
    newest first, as the teacher's worked examples."""
    from training.targets import WorkedExample, resolve_turn, student_context

    corrected = (
        Feedback.objects.filter(
            trace__project_id=feedback.trace.project_id,
            text__iexact=feedback.text.strip(),
            from_reviewer=True,
            correction__isnull=False,
        )
        .exclude(trace_id=feedback.trace_id)
        .exclude(status=FeedbackStatus.DISMISSED)
        .select_related("trace")
        .order_by("-id")[:limit]
    )

    def candidates():
        for other in corrected:
            messages = other.trace.body_json()["messages"]
            try:
                context = student_context(messages, resolve_turn(messages, other.turn))
            except ValueError:  # the trace changed under the feedback: not an example
                continue
            yield WorkedExample.ending(context, other.correction)

    return fit_worked_examples(candidates(), limit)


def fit_worked_examples(candidates: Iterable, limit: int = WORKED_EXAMPLES) -> list:
    """The first `limit` candidate worked examples (None: no example) that fit, in order,
    within WORKED_EXAMPLE_CHARS in all; one too long is passed over for shorter ones after it."""
    examples, room = [], WORKED_EXAMPLE_CHARS
    for example in candidates:
        if len(examples) == limit:
            break
        if example is not None and example.size <= room:
            examples.append(example)
            room -= example.size
    return examples


def propose_targets_for(*, feedback_id: int) -> int:
    """Targets for one feedback; a second call (or a deleted feedback) stores nothing."""
    from training.targets import (
        hint_context,
        propose_targets,
        resolve_turn,
        rewrite_context,
        student_context,
    )

    feedback = Feedback.objects.select_related("trace__project").filter(pk=feedback_id).first()
    if feedback is None or feedback.status != FeedbackStatus.OPEN or feedback.targets.exists():
        return 0  # deleted, failed or dismissed meanwhile, or a second delivery
    body = feedback.trace.body_json()
    messages = body["messages"]
    turn = resolve_turn(messages, feedback.turn)
    context = student_context(messages, turn)
    project = feedback.trace.project
    project_settings = settings_for(project)
    config = project_settings.training_config(mode="sft")
    prompt = config.teacher_prompt
    if feedback.correction:
        rows = [
            DistillationTarget(
                feedback=feedback,
                turn=turn,
                source="correction",
                student_context=context,
                original=messages[turn],
                target=feedback.correction,
                # A reviewer's correction is the strongest target; one a harness or an end
                # user sent (a key without the review scope) waits for a reviewer.
                state=TargetState.APPROVED if feedback.from_reviewer else TargetState.PROPOSED,
            )
        ]
    else:
        examples = worked_examples_for(feedback) if prompt == "hint" else []
        try:
            proposals = propose_targets(
                teacher_for(project, project_settings, seed=config.seed),
                messages,
                turn,
                feedback.text,
                feedback.checks,
                prompt=prompt,
                n=TEACHER_SAMPLES_PER_ROUND,
                budget=TEACHER_BUDGET,
                tools=tools_shown(body, turn),
                examples=examples,
                # Revisions that keep the team's earlier lessons first: auto-approval takes one.
                unkept_lessons=unkept_lessons(earlier_lessons(feedback)),
                edit_original=config.teacher_edits,
            )
        except OutboundRefused as error:
            mark_feedback_failed(feedback_id=feedback.pk, reason=f"teacher.url refused: {error}")
            return 0
        except httpx.HTTPStatusError as error:
            # The teacher refused this feedback (too long for its context, say): a person sees
            # why on the trace and Retrain pages, and can retry it.
            mark_feedback_failed(
                feedback_id=feedback.pk,
                reason=f"the teacher answered HTTP {error.response.status_code}: "
                f"{error.response.text[:500]}",
            )
            return 0
        if not any(proposal.passes_checks for proposal in proposals):
            mark_feedback_failed(
                feedback_id=feedback.pk,
                reason=f"none of the teacher's {len(proposals)} revisions followed it (checks "
                "failed); write a corrected turn instead",
            )
            return 0
        teacher_context = (
            rewrite_context(context, messages[turn], feedback.text)
            if prompt == "rewrite"
            else hint_context(context, feedback.text, examples)
        )
        # Auto-approve takes the best passing proposal only: one choice per feedback, not
        # several near-identical targets weighing it several times; and never one that looks
        # garbled (a count kept by the teacher's edit passes an ending's check), as a person
        # approving in bulk would not (approvals.FeedbackTargets.approvable).
        auto_approve = (
            project_settings.auto_approve == "checks_pass"
            and bool(feedback.checks)
            and feedback.from_reviewer  # checks a harness wrote prove nothing to a reviewer
        )
        approvable = (
            rank
            for rank, proposal in enumerate(proposals)
            if proposal.passes_checks
            and not reply_looks_garbled(proposal.message, feedback_text=feedback.text)
        )
        auto_approved = next(approvable, None) if auto_approve else None
        rows = [
            DistillationTarget(
                feedback=feedback,
                turn=turn,
                source=prompt,
                student_context=context,
                teacher_context=teacher_context,
                original=messages[turn],
                target=proposal.message,
                passes_checks=proposal.passes_checks,
                state=TargetState.APPROVED if rank == auto_approved else TargetState.PROPOSED,
            )
            for rank, proposal in enumerate(proposals)
        ]
    with transaction.atomic():
        # Two deliveries can overlap (the broker presumed a slow worker dead): the row lock
        # makes the later one see the earlier one's targets and store none of its own.
        locked = Feedback.objects.select_for_update().filter(pk=feedback.pk).first()
        if locked is None or feedback.targets.exists():  # deleted meanwhile, or a second delivery
            return 0
        DistillationTarget.objects.bulk_create(rows)
        Feedback.objects.filter(pk=feedback.pk).update(status=FeedbackStatus.USED)
    return len(rows)
