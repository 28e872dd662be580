"""Writing feedback and outcomes onto stored traces."""

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

import jsonschema
import orjson
from django.core import serializers
from django.db import IntegrityError, transaction
from django.utils import timezone
from pydantic import ValidationError

from messages.text import message_text
from reviewapp import jobs
from reviewapp.projects.models import ApiKey, KeyScope
from reviewapp.projects.project_settings import settings_for
from reviewapp.review.models import CopiedFeedback, DeletedFeedback, Feedback, FeedbackStatus
from reviewapp.traces.chat import Message, describe_validation_error
from reviewapp.traces.models import Trace
from reviewapp.traces.rollups import roll_up_traces
from training.checks import check_problem

# Feedback becomes part of a teacher prompt and a correction becomes a training target: both must
# fit a model's context. 8,000 characters is ~2,000 tokens; 32 KB holds a long answer or tool call.
MAX_FEEDBACK_TEXT_LENGTH = 8_000
MAX_CORRECTION_BYTES = 32_000
# Tokens are estimated as characters / 3: the web process loads no tokenizer, and 3 characters a
# token (code, JSON, non-English text; English runs near 4) rarely calls a context that overflows
# a fit. A teacher call that still overflows is marked failed by the target task.
CHARACTERS_PER_TOKEN = 3
# How long a feedback deleted on the trace page can be put back with "Undo".
UNDO_SECONDS = 10 * 60


class FeedbackError(ValueError):
    """Feedback that does not fit its trace; the message names the field."""


def assistant_turn_for_tool_call(messages: list[dict], tool_call_id: str) -> int | None:
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        if any(call.get("id") == tool_call_id for call in message.get("tool_calls") or ()):
            return index
    return None


def _validated_anchor(
    messages: list[dict], turn: int | None, tool_call_id: str | None
) -> tuple[int | None, str]:
    if tool_call_id:
        call_turn = assistant_turn_for_tool_call(messages, tool_call_id)
        if call_turn is None:
            raise FeedbackError(f"tool_call_id: {tool_call_id!r} is not a tool call in this trace")
        if turn is not None and turn != call_turn:
            raise FeedbackError(
                f"turn: {turn} does not hold tool call {tool_call_id!r} (it is in turn {call_turn})"
            )
        return call_turn, tool_call_id
    if turn is None:
        return None, ""
    if not 0 <= turn < len(messages):
        raise FeedbackError(f"turn: {turn} is outside the trace's {len(messages)} messages")
    role = messages[turn].get("role")
    if role != "assistant":
        raise FeedbackError(f"turn: message {turn} is a {role} message, not an assistant turn")
    return turn, ""


def _validated_correction(correction: dict, tools: list[dict]) -> dict:
    correction = {"role": "assistant", **correction}
    try:
        message = Message.model_validate(correction)
    except ValidationError as error:
        raise FeedbackError("correction." + describe_validation_error(error)) from None
    if message.role != "assistant":
        raise FeedbackError("correction.role: a correction is an assistant message")
    if not message.content and not message.tool_calls:
        raise FeedbackError("correction: needs content or tool_calls")
    schemas = {
        tool["function"]["name"]: tool["function"].get("parameters") or {"type": "object"}
        for tool in tools
    }
    for index, call in enumerate(message.tool_calls or ()):
        where = f"correction.tool_calls[{index}].function"
        name = call.function.name
        if name not in schemas:
            known = ", ".join(sorted(schemas)) or "none"
            raise FeedbackError(f"{where}.name: {name!r} is not a tool of this trace ({known})")
        arguments = json.loads(call.function.arguments)
        try:
            jsonschema.validate(arguments, schemas[name])
        except jsonschema.ValidationError as error:
            at = "/".join(str(part) for part in error.absolute_path) or "(top)"
            raise FeedbackError(
                f"{where}.arguments: {error.message} at {at}, per the {name} tool's schema"
            ) from None
        except jsonschema.SchemaError:
            pass  # the harness sent a broken schema; nothing to validate against
    return correction


def _validated_checks(checks: list[dict], tools: list[dict]) -> list[dict]:
    tool_names = {tool["function"]["name"] for tool in tools}
    for index, check in enumerate(checks):
        problem = check_problem(check.get("kind"), check.get("value"), tool_names)
        if problem:
            raise FeedbackError(f"checks[{index}].{problem}")
    return [{"kind": check["kind"], "value": check["value"]} for check in checks]


def context_problem(*, feedback: Feedback) -> str:
    """Why the model cannot learn from this feedback within its context, or "" when it fits.

    The teacher sees the student context plus the feedback and writes the turn again; the
    trainer leaves out any sequence longer than the project's `max_seq_len`.
    """
    messages = feedback.trace.body_json()["messages"]
    turn = feedback.turn
    if turn is None:  # about the whole trace: the last assistant turn, as the target task reads it
        turn = max(
            (i for i, message in enumerate(messages) if message.get("role") == "assistant"),
            default=len(messages),
        )
    characters = len(feedback.text) + sum(
        len(message_text(message)) + len(orjson.dumps(message.get("tool_calls") or []))
        for message in messages[: turn + 1]
    )
    tokens = characters // CHARACTERS_PER_TOKEN
    limit = settings_for(feedback.trace.project).training_config(mode="sft").max_seq_len
    if tokens <= limit:
        return ""
    return (
        f"too long for the model's context: the conversation up to turn {turn} and the "
        f"feedback are about {tokens} tokens (characters / {CHARACTERS_PER_TOKEN}), "
        f"over the {limit} the model trains on (max_seq_len)"
    )


def mark_feedback_failed(*, feedback_id: int, reason: str) -> bool:
    """Record that the model could not use an open feedback, and why; False when it was not open.

    The target task calls it when the teacher fails; an admin's retry reopens it.
    """
    return bool(
        Feedback.objects.filter(pk=feedback_id, status=FeedbackStatus.OPEN).update(
            status=FeedbackStatus.FAILED, failure_reason=reason
        )
    )


def _ask_for_targets(feedback: Feedback) -> None:
    jobs.enqueue_on_commit(jobs.PROPOSE_TARGETS, feedback.pk)


@transaction.atomic
def retry_feedback(*, feedback: Feedback) -> bool:
    """Reopen a failed feedback and ask for its targets again; False when it still cannot be used
    (its reason is refreshed) or it was not failed."""
    problem = context_problem(feedback=feedback)
    if problem:
        Feedback.objects.filter(pk=feedback.pk, status=FeedbackStatus.FAILED).update(
            failure_reason=problem
        )
        feedback.failure_reason = problem
        return False
    reopened = Feedback.objects.filter(pk=feedback.pk, status=FeedbackStatus.FAILED).update(
        status=FeedbackStatus.OPEN, failure_reason=""
    )
    if not reopened:
        return False
    feedback.status, feedback.failure_reason = FeedbackStatus.OPEN, ""
    _ask_for_targets(feedback)
    return True


@transaction.atomic
def correct_feedback(*, feedback: Feedback, correction_text: str) -> Feedback:
    """Give a feedback the model could not use a corrected turn, and ask for its targets again:
    the correction is the target, no teacher needed."""
    if feedback.status != FeedbackStatus.FAILED:
        raise FeedbackError("status: only feedback the model could not use is corrected here")
    text = correction_text.strip()
    if not text:
        raise FeedbackError("correction: write the corrected turn")
    body = feedback.trace.body_json()
    messages = body["messages"]
    turn = feedback.turn
    if turn is None:  # about the whole trace: its last assistant turn, as the target task reads it
        turns = [i for i, message in enumerate(messages) if message.get("role") == "assistant"]
        if not turns:
            raise FeedbackError("correction: this trace has no assistant turn to correct")
        turn = turns[-1]
    if len(text.encode()) > MAX_CORRECTION_BYTES:
        raise FeedbackError(
            f"correction: {len(text.encode())} bytes is over the limit of {MAX_CORRECTION_BYTES}"
        )
    correction = _validated_correction({"content": text}, body["tools"])
    feedback.turn, feedback.correction = turn, correction
    problem = context_problem(feedback=feedback)
    if problem:  # a correction does not make the conversation fit the model's context
        raise FeedbackError(problem)
    content_hash = _feedback_hash(
        turn=turn,
        tool_call_id=feedback.tool_call_id,
        author=feedback.author,
        reviewer=feedback.reviewer_id,
        text=feedback.text,
        rating=feedback.rating,
        correction=correction,
        checks=feedback.checks,
    )
    if Feedback.objects.filter(trace=feedback.trace, content_hash=content_hash).exists():
        raise FeedbackError("correction: this feedback already has that correction")
    reopened = Feedback.objects.filter(pk=feedback.pk, status=FeedbackStatus.FAILED).update(
        turn=turn,
        correction=correction,
        content_hash=content_hash,
        status=FeedbackStatus.OPEN,
        failure_reason="",
    )
    if not reopened:
        raise FeedbackError("status: only feedback the model could not use is corrected here")
    feedback.status, feedback.failure_reason, feedback.content_hash = (
        FeedbackStatus.OPEN,
        "",
        content_hash,
    )
    _ask_for_targets(feedback)
    if feedback.from_reviewer:
        retry_failed_alike(feedback=feedback)
    return feedback


def _feedback_hash(**fields: Any) -> str:
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()


def record_feedback(
    *,
    trace: Trace,
    text: str,
    turn: int | None = None,
    tool_call_id: str | None = None,
    rating: float | None = None,
    author: str = "",
    correction: dict | None = None,
    checks: list[dict] | None = None,
    reviewer=None,
    api_key: ApiKey | None = None,
) -> tuple[Feedback, bool]:
    """Validate feedback against its trace and store it once; returns (feedback, created).

    `api_key`: the key that sent it over the API. Without the review scope its feedback is not
    from a reviewer, whatever `author` says, and its targets wait for a reviewer's approval.
    """
    if len(text) > MAX_FEEDBACK_TEXT_LENGTH:
        raise FeedbackError(
            f"text: {len(text)} characters is over the limit of {MAX_FEEDBACK_TEXT_LENGTH}; "
            "feedback is shown to the model, so it must fit its context"
        )
    body = trace.body_json()
    messages, tools = body["messages"], body["tools"]
    turn, tool_call_id = _validated_anchor(messages, turn, tool_call_id)
    if correction is not None:
        if turn is None:
            raise FeedbackError("correction: pin the feedback to a turn to correct it")
        size = len(orjson.dumps(correction))
        if size > MAX_CORRECTION_BYTES:
            raise FeedbackError(
                f"correction: {size} bytes is over the limit of {MAX_CORRECTION_BYTES}; "
                "a correction becomes a training target, so it must fit the model's context"
            )
        correction = _validated_correction(correction, tools)
    checks = _validated_checks(checks or [], tools)
    content_hash = _feedback_hash(
        turn=turn,
        tool_call_id=tool_call_id,
        author=author,
        reviewer=reviewer.pk if reviewer else None,
        text=text,
        rating=rating,
        correction=correction,
        checks=checks,
    )
    existing = Feedback.objects.filter(trace=trace, content_hash=content_hash).first()
    if existing:
        return existing, False
    try:
        with transaction.atomic():
            feedback = Feedback.objects.create(
                trace=trace,
                turn=turn,
                tool_call_id=tool_call_id,
                author=author,
                reviewer=reviewer,
                api_key=api_key,
                from_reviewer=api_key is None or api_key.has_scope(KeyScope.REVIEW),
                text=text,
                rating=rating,
                correction=correction,
                checks=checks,
                content_hash=content_hash,
            )
    except IntegrityError:  # the same feedback sent twice at once
        return Feedback.objects.get(trace=trace, content_hash=content_hash), False
    problem = context_problem(feedback=feedback)
    if problem:  # stored and shown, so the writer learns why nothing comes of it
        mark_feedback_failed(feedback_id=feedback.pk, reason=problem)
        feedback.status, feedback.failure_reason = FeedbackStatus.FAILED, problem
    else:
        _ask_for_targets(feedback)
        if correction is not None and feedback.from_reviewer:
            retry_failed_alike(feedback=feedback)
    # A trace's text for similarity includes its feedback.
    jobs.enqueue_on_commit(jobs.EMBED_TRACES, [trace.pk])
    return feedback, True


# A correction reopens at most this many failed feedback of the same text at once.
MAX_RETRIED_ALIKE = 100


def retry_failed_alike(*, feedback: Feedback) -> int:
    """A reviewer's correction is a worked example the teacher is shown for every feedback of
    the same text (learning/targets.worked_examples_for): ask again for those the teacher could
    not follow before. Returns how many were reopened."""
    failed = (
        Feedback.objects.filter(
            trace__project_id=feedback.trace.project_id,
            text__iexact=feedback.text.strip(),
            status=FeedbackStatus.FAILED,
            correction__isnull=True,
        )
        .exclude(pk=feedback.pk)
        .select_related("trace")
        .order_by("-id")[:MAX_RETRIED_ALIKE]
    )
    return sum(retry_feedback(feedback=other) for other in failed)


def record_outcome(
    *,
    trace: Trace,
    reward: float | None = None,
    success: bool | None = None,
    termination: str | None = None,
) -> Trace:
    """Set what happened in the end; fields left out keep their stored value."""
    changes = {
        name: value
        for name, value in (("reward", reward), ("success", success), ("termination", termination))
        if value is not None
    }
    if not changes:
        raise FeedbackError("give at least one of reward, success, termination")
    with transaction.atomic():
        Trace.objects.filter(pk=trace.pk).update(**changes)
        roll_up_traces(trace_ids=[trace.pk])  # the monitors count outcomes and terminations
    for name, value in changes.items():
        setattr(trace, name, value)
    jobs.after_traces_changed([trace.pk])  # rules may match on the outcome or termination
    return trace


@transaction.atomic
def delete_feedback(*, feedback: Feedback) -> bool:
    """Delete a feedback and its targets; returns False when it was dismissed instead.

    Feedback whose targets a run used stays, dismissed, so the adapter's lineage keeps it; new
    runs leave dismissed feedback out.
    """
    Feedback.objects.select_for_update().filter(pk=feedback.pk).first()
    if feedback.targets.filter(runs__isnull=False).exists():
        Feedback.objects.filter(pk=feedback.pk).update(status=FeedbackStatus.DISMISSED)
        feedback.status = FeedbackStatus.DISMISSED
        return False
    feedback.targets.all().delete()
    feedback.delete()
    return True


@transaction.atomic
def delete_feedback_with_undo(*, feedback: Feedback, deleted_by) -> DeletedFeedback | None:
    """delete_feedback, keeping what it deletes for UNDO_SECONDS; None when the feedback was
    dismissed instead (nothing was deleted, so there is nothing to undo)."""
    Feedback.objects.select_for_update().filter(pk=feedback.pk).first()
    rows = [feedback, *feedback.targets.all()]
    rows += CopiedFeedback.objects.filter(feedback=feedback)
    snapshot = {
        "feedback": feedback.pk,
        "rows": _as_json(serializers.serialize("python", rows)),
        "copies": list(feedback.copies.values_list("pk", flat=True)),
    }
    trace = feedback.trace
    if not delete_feedback(feedback=feedback):
        return None
    DeletedFeedback.objects.filter(
        deleted_at__lt=timezone.now() - timedelta(seconds=UNDO_SECONDS)
    ).delete()
    return DeletedFeedback.objects.create(trace=trace, deleted_by=deleted_by, snapshot=snapshot)


def _as_json(rows: list[dict]) -> list[dict]:
    """Serialized rows with their times as full ISO strings (Django's JSON serializer keeps
    milliseconds only, so an undo would not give back the same times)."""
    for row in rows:
        for name, value in row["fields"].items():
            if isinstance(value, datetime):
                row["fields"][name] = value.isoformat()
    return rows


@transaction.atomic
def undo_feedback_delete(*, deleted: DeletedFeedback) -> Feedback:
    """Put a deleted feedback back as it was: its id, fields, targets and copy links.

    Raises FeedbackError when the undo came too late or the same feedback was written again
    since (the trace holds one of each)."""
    if deleted.deleted_at < timezone.now() - timedelta(seconds=UNDO_SECONDS):
        raise FeedbackError(
            f"too late to undo: a delete can be undone for {UNDO_SECONDS // 60} min"
        )
    snapshot = deleted.snapshot
    try:
        with transaction.atomic():
            for row in serializers.deserialize("python", snapshot["rows"]):
                row.save()
    except IntegrityError as error:
        raise FeedbackError("the same feedback was written again since the delete") from error
    CopiedFeedback.objects.filter(pk__in=snapshot["copies"], source__isnull=True).update(
        source_id=snapshot["feedback"]
    )
    deleted.delete()
    feedback = Feedback.objects.get(pk=snapshot["feedback"])
    if feedback.status == FeedbackStatus.OPEN and not feedback.targets.exists():
        _ask_for_targets(feedback)  # a target task that ran while it was gone found nothing
    jobs.enqueue_on_commit(jobs.EMBED_TRACES, [feedback.trace_id])
    return feedback


@transaction.atomic
def record_feedback_on_traces(*, traces: list[Trace], text: str, reviewer) -> int:
    """The reviewer's feedback about the whole trace on every one of the traces, all or none
    (the trace list's bulk action); returns how many got it new (a trace that already has the
    same feedback from this reviewer keeps the one)."""
    if len({trace.project_id for trace in traces}) > 1:
        raise FeedbackError("feedback goes on traces of one project at a time")
    written = 0
    for trace in traces:
        _, created = record_feedback(
            trace=trace, text=text, reviewer=reviewer, author=reviewer.get_username()
        )
        written += created
    return written
