"""Reviewed data as OpenAI fine-tuning JSONL: one {"messages", "tools"?} object per line."""

from collections.abc import Iterator

import orjson
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Query, Router, Schema
from ninja.errors import HttpError

from reviewapp.api.schemas import ERRORS
from reviewapp.learning.dataset import TrainingSet, build_training_set
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope, Project
from reviewapp.review.models import Feedback
from reviewapp.traces.models import FAILURE_TERMINATIONS, Trace, TraceSource, TraceTag, tools_shown

router = Router(tags=["export"])


class ExportFilters(Schema):
    source: TraceSource | None = None
    tag: str | None = None
    # "learned": corrections and approved targets only (what training would use);
    # "reviewed": also reviewed traces that ended in success, as they are.
    include: str = "learned"


def _line(messages: list[dict], tools: list[dict] | None) -> bytes:
    record: dict = {"messages": messages}
    if tools:
        record["tools"] = tools
    return orjson.dumps(record) + b"\n"


def _before_the_lesson(context: list[dict]) -> list[dict]:
    """The turns before a learned one, with each assistant turn at weight 0.

    OpenAI fine-tuning trains on every assistant message unless its `weight` is 0; these turns
    are what the model said before the one a reviewer corrected, often the same mistake, and
    our own training learns only the corrected turn too.
    """
    return [
        {**message, "weight": 0} if message.get("role") == "assistant" else message
        for message in context
    ]


def _filtered_traces(project: Project, filters: ExportFilters) -> QuerySet[Trace]:
    traces = Trace.objects.filter(project=project)
    if filters.source:
        traces = traces.filter(source=filters.source)
    if filters.tag:
        traces = traces.filter(
            Exists(TraceTag.objects.filter(trace=OuterRef("pk"), tag__name=filters.tag))
        )
    return traces


def _export_lines(
    traces: QuerySet[Trace], filters: ExportFilters, training_set: TrainingSet
) -> Iterator[bytes]:
    # The data policy applies here as in training; what it leaves out is in the response header.
    corrected = Feedback.objects.filter(
        trace__in=traces, correction__isnull=False, turn__isnull=False
    ).exclude(trace__termination__in=training_set.policy.excluded_terminations())
    for feedback in corrected.select_related("trace").order_by("id").iterator(chunk_size=200):
        body = feedback.trace.body_json()
        context = _before_the_lesson(body["messages"][: feedback.turn])
        yield _line([*context, feedback.correction], tools_shown(body, feedback.turn))
    bodies: dict[int, dict] = {}
    for target in training_set.targets:
        if target.source == "correction":  # exported above, from its feedback
            continue
        trace_id = target.feedback.trace_id
        if trace_id not in bodies:
            bodies[trace_id] = Trace.objects.get(pk=trace_id).body_json()
        context = _before_the_lesson(target.student_context)
        yield _line([*context, target.target], tools_shown(bodies[trace_id], target.turn))
    if filters.include == "reviewed":
        reviewed_good = (
            # A timed-out or tool-failed episode counts as a failure, whatever it reported.
            traces.filter(success=True)
            .exclude(termination__in=FAILURE_TERMINATIONS)
            .filter(
                Exists(TraceTag.objects.filter(trace=OuterRef("pk"), reviewer__isnull=False))
                | Exists(Feedback.objects.filter(trace=OuterRef("pk")))
            )
            .exclude(
                Exists(Feedback.objects.filter(trace=OuterRef("pk"), correction__isnull=False))
            )
        )
        for trace in reviewed_good.order_by("id").iterator(chunk_size=200):
            body = trace.body_json()
            yield _line(body["messages"], body["tools"])


@router.get(
    "/export.jsonl",
    response={200: None, **ERRORS},
    summary="Reviewed data as OpenAI fine-tuning JSONL",
    **requires(KeyScope.ADMIN),
)
def export_jsonl(request: HttpRequest, filters: Query[ExportFilters]):
    if filters.include not in ("learned", "reviewed"):
        raise HttpError(422, "include: must be 'learned' or 'reviewed'")
    traces = _filtered_traces(request.auth, filters)
    try:
        training_set = build_training_set(project=request.auth, traces=traces)
    except ValueError as error:
        raise HttpError(422, f"the project's data policy is invalid: {error}") from None
    response = StreamingHttpResponse(
        _export_lines(traces, filters, training_set), content_type="application/jsonl"
    )
    response["X-Training-Exclusions"] = orjson.dumps(training_set.excluded).decode()
    response["Content-Disposition"] = f'attachment; filename="{request.auth.slug}.jsonl"'
    return response
