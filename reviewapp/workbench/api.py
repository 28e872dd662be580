"""The trace API: batch ingest, list, read (with the review state and the adapters that learnt from
each feedback), feedback and outcomes."""

from django.conf import settings
from django.db.models import Count, Prefetch
from django.http import HttpRequest
from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError

from reviewapp.api.pagination import decode_cursor, page_of
from reviewapp.api.schemas import ERRORS
from reviewapp.learning.lineage import adapters_by_feedback
from reviewapp.projects.access import first_or_404
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import ApiKey, KeyScope
from reviewapp.review.feedback import (
    FeedbackError,
    delete_feedback,
    record_feedback,
    record_outcome,
)
from reviewapp.review.models import Feedback
from reviewapp.traces.access import get_trace_for_project
from reviewapp.traces.api import schemas as ingest_schemas
from reviewapp.traces.chat import text_problem
from reviewapp.traces.filters import text_matches
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace, TraceSource, TraceTag
from reviewapp.workbench import schemas

router = Router(tags=["traces"])


def _reject_unstorable_text(payload: Schema) -> None:
    problem = text_problem(payload.dict(), max_depth=settings.INGEST_MAX_NESTING_DEPTH)
    if problem:
        raise HttpError(422, problem)


def _tag_names(trace: Trace) -> list[str]:
    return sorted({trace_tag.tag.name for trace_tag in trace.trace_tags.all()})


def _outcome(trace: Trace) -> dict:
    return {"reward": trace.reward, "success": trace.success}


def _summary(trace: Trace) -> dict:
    return {
        "external_id": trace.external_id,
        "source": trace.source,
        "model": trace.model,
        "adapter_version": trace.adapter_version,
        "termination": trace.termination,
        "outcome": _outcome(trace),
        "message_count": trace.message_count,
        "tool_call_count": trace.tool_call_count,
        "preview": trace.preview,
        "tags": _tag_names(trace),
        "feedback_count": trace.feedback_count,
        "started_at": trace.started_at,
        "ended_at": trace.ended_at,
        "received_at": trace.received_at,
    }


def _feedback_source(feedback: Feedback) -> dict:
    # The key or person that sent it, never `author`: a key may claim any author.
    if feedback.api_key_id is not None:
        key = feedback.api_key
        return {"kind": "api_key", "name": key.name, "prefix": key.prefix}
    if feedback.reviewer_id is not None:
        return {"kind": "person", "username": feedback.reviewer.get_username()}
    return {"kind": "unknown"}


def _feedback_json(feedback: Feedback) -> dict:
    return {
        "id": feedback.pk,
        "turn": feedback.turn,
        "tool_call_id": feedback.tool_call_id or None,
        "author": feedback.author,
        "text": feedback.text,
        "rating": feedback.rating,
        "correction": feedback.correction,
        "checks": feedback.checks,
        "status": feedback.status,
        "from_reviewer": feedback.from_reviewer,
        "api_key": feedback.api_key.prefix if feedback.api_key else None,
        "source": _feedback_source(feedback),
        "created_at": feedback.created_at,
    }


@router.post(
    "/traces",
    response={207: ingest_schemas.BatchResultOut, **ERRORS},
    summary="Ingest a batch of traces (idempotent on external_id)",
    exclude_none=True,
    **requires(KeyScope.INGEST),
)
def post_traces(request: HttpRequest, batch: ingest_schemas.TraceBatchIn):
    limit = settings.INGEST_MAX_TRACES_PER_BATCH
    if len(batch.traces) > limit:
        raise HttpError(413, f"{len(batch.traces)} traces is over the limit of {limit} per batch")
    results = ingest_traces(
        project=request.auth,
        raw_items=batch.traces,
        source=TraceSource.API,
        # The taxonomy is the reviewers': other keys may apply its tags, not add to it.
        create_tags=request.api_key.has_scope(KeyScope.REVIEW),
    )
    return Status(207, {"results": [result.as_json() for result in results]})


class TraceFilters(Schema):
    source: TraceSource | None = None
    q: str | None = None
    limit: int = 50
    cursor: str | None = None


@router.get(
    "/traces",
    response={200: schemas.TraceListOut, **ERRORS},
    summary="List traces",
    **requires(KeyScope.INGEST, KeyScope.REVIEW),
)
def list_traces(request: HttpRequest, filters: Query[TraceFilters]):
    if not 1 <= filters.limit <= 500:
        raise HttpError(422, "limit: must be between 1 and 500")
    traces = (
        Trace.objects.filter(project=request.auth)
        .defer("body", "metadata", "search_text")
        .annotate(feedback_count=Count("feedback"))
        .prefetch_related(Prefetch("trace_tags", TraceTag.objects.select_related("tag")))
        .order_by("-id")
    )
    if filters.source:
        traces = traces.filter(source=filters.source)
    if filters.q:
        traces = traces.filter(text_matches(filters.q))
    if filters.cursor:
        traces = traces.filter(id__lt=decode_cursor(filters.cursor))
    page, next_cursor = page_of(traces, filters.limit, key=lambda trace: trace.id)
    return {"traces": [_summary(trace) for trace in page], "next": next_cursor}


@router.get(
    "/traces/{external_id}",
    response={200: schemas.TraceOut, **ERRORS},
    summary="One trace as stored, with its review state",
    **requires(KeyScope.INGEST, KeyScope.REVIEW),
)
def get_trace(request: HttpRequest, external_id: str):
    trace = get_trace_for_project(request.auth, external_id)
    body = trace.body_json()
    tags = sorted(set(TraceTag.objects.filter(trace=trace).values_list("tag__name", flat=True)))
    feedback_rows = list(trace.feedback.select_related("api_key", "reviewer").order_by("id"))
    learned_by = adapters_by_feedback([item.pk for item in feedback_rows])
    feedback = [
        {**_feedback_json(item), "adapters": [a.name for a in learned_by.get(item.pk, [])]}
        for item in feedback_rows
    ]
    return {
        "external_id": trace.external_id,
        "source": trace.source,
        "messages": body["messages"],
        "tools": body["tools"],
        "model": trace.model or None,
        "adapter_version": trace.adapter_version or None,
        "metadata": trace.metadata,
        "termination": trace.termination,
        "outcome": _outcome(trace),
        "started_at": trace.started_at,
        "ended_at": trace.ended_at,
        "received_at": trace.received_at,
        "usage": {
            "prompt_tokens": trace.prompt_tokens,
            "completion_tokens": trace.completion_tokens,
        },
        "tags": tags,
        "review": {"tags": tags, "feedback": feedback, "reviewed": bool(tags or feedback)},
    }


@router.post(
    "/traces/{external_id}/feedback",
    response={200: schemas.FeedbackOut, 201: schemas.FeedbackOut, **ERRORS},
    summary="Pin written feedback to a trace, a turn or a tool call",
    **requires(KeyScope.INGEST, KeyScope.REVIEW),
)
def post_feedback(request: HttpRequest, external_id: str, payload: schemas.FeedbackIn):
    trace = get_trace_for_project(request.auth, external_id)
    _reject_unstorable_text(payload)
    try:
        feedback, created = record_feedback(
            trace=trace,
            text=payload.text,
            turn=payload.turn,
            tool_call_id=payload.tool_call_id,
            rating=payload.rating,
            author=payload.author or "api",
            correction=payload.correction,
            checks=[check.dict() for check in payload.checks],
            api_key=request.api_key,
        )
    except FeedbackError as error:
        raise HttpError(422, str(error)) from None
    return Status(201 if created else 200, _feedback_json(feedback))


def _deletion_refusal(feedback: Feedback, key: ApiKey) -> str:
    """Why this key may not delete this feedback, or "" when it may.

    A harness's key (ingest scope) deletes what ingest keys sent; a reviewer's work goes only on
    a reviewer's word: a key with the review scope, or its author in the dashboard.
    """
    if feedback.reviewer_id is not None:
        return (
            f"feedback {feedback.pk} was written by a person in the dashboard; only its author "
            "deletes it, there"
        )
    if key.has_scope(KeyScope.REVIEW):
        return ""
    held = ", ".join(key.scopes)
    if feedback.from_reviewer:
        return (
            f"feedback {feedback.pk} is a reviewer's (written in the dashboard or with the review "
            f"scope); deleting it needs an API key with the review scope (this key has: {held})"
        )
    if feedback.api_key_id is None:
        return (
            f"feedback {feedback.pk} records no key that sent it (the key was deleted, or it "
            "predates keys being recorded), so it is not known to be an ingest key's; deleting "
            f"it needs an API key with the review scope (this key has: {held})"
        )
    return ""


def _get_feedback_for_key(key: ApiKey, trace: Trace, feedback_id: int) -> Feedback:
    feedback = first_or_404(
        trace.feedback.filter(pk=feedback_id), f"no feedback {feedback_id} on this trace"
    )
    refusal = _deletion_refusal(feedback, key)
    if refusal:
        raise HttpError(403, refusal)
    return feedback


@router.delete(
    "/traces/{external_id}/feedback/{feedback_id}",
    response={200: schemas.FeedbackOut, 204: None, **ERRORS},
    summary="Delete feedback sent over the API (a reviewer's needs the review scope); feedback "
    "an adapter learned from is dismissed",
    **requires(KeyScope.INGEST, KeyScope.REVIEW),
)
def delete_feedback_by_api(request: HttpRequest, external_id: str, feedback_id: int):
    """204 when deleted; 200 with status `dismissed` when a run used its targets (the adapter's
    lineage keeps it); 403 naming why when the feedback is not this key's to delete."""
    trace = get_trace_for_project(request.auth, external_id)
    feedback = _get_feedback_for_key(request.api_key, trace, feedback_id)
    if delete_feedback(feedback=feedback):
        return Status(204, None)
    return Status(200, _feedback_json(feedback))


@router.post(
    "/traces/{external_id}/outcome",
    response={200: schemas.TraceSummaryOut, **ERRORS},
    summary="Record the reward, success or termination of a trace",
    **requires(KeyScope.INGEST),
)
def post_outcome(request: HttpRequest, external_id: str, payload: schemas.OutcomeIn):
    trace = get_trace_for_project(request.auth, external_id)
    try:
        trace = record_outcome(
            trace=trace,
            reward=payload.reward,
            success=payload.success,
            termination=payload.termination,
        )
    except FeedbackError as error:
        raise HttpError(422, str(error)) from None
    trace.feedback_count = trace.feedback.count()
    return _summary(trace)
