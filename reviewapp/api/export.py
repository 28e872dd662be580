"""Reviewed data as OpenAI fine-tuning JSONL: one {"messages", "tools"?} object per line."""

from collections.abc import Iterator

import orjson
from django.db.models import Exists, OuterRef
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Query, Router, Schema
from ninja.errors import HttpError

from reviewapp.api.traces import ERRORS
from reviewapp.models import (
    DistillationTarget,
    Feedback,
    Project,
    TargetState,
    Trace,
    TraceSource,
    TraceTag,
)

router = Router(tags=["export"])


class ExportFilters(Schema):
    source: TraceSource | None = None
    tag: str | None = None
    # "learned": corrections and approved targets only (what training would use);
    # "reviewed": also reviewed traces that ended in success, as they are.
    include: str = "learned"


def _line(messages: list[dict], tools: list[dict]) -> bytes:
    record: dict = {"messages": messages}
    if tools:
        record["tools"] = tools
    return orjson.dumps(record) + b"\n"


def _export_lines(project: Project, filters: ExportFilters) -> Iterator[bytes]:
    traces = Trace.objects.filter(project=project)
    if filters.source:
        traces = traces.filter(source=filters.source)
    if filters.tag:
        traces = traces.filter(
            Exists(TraceTag.objects.filter(trace=OuterRef("pk"), tag__name=filters.tag))
        )
    corrected = Feedback.objects.filter(
        trace__in=traces, correction__isnull=False, turn__isnull=False
    )
    for feedback in corrected.select_related("trace").order_by("id").iterator(chunk_size=200):
        body = feedback.trace.body_json()
        yield _line([*body["messages"][: feedback.turn], feedback.correction], body["tools"])
    approved = DistillationTarget.objects.filter(
        feedback__trace__in=traces, state__in=(TargetState.APPROVED, TargetState.EDITED)
    ).exclude(source="correction")
    for target in (
        approved.select_related("feedback__trace").order_by("id").iterator(chunk_size=200)
    ):
        tools = target.feedback.trace.body_json()["tools"]
        yield _line([*target.student_context, target.target], tools)
    if filters.include == "reviewed":
        reviewed_good = (
            traces.filter(success=True)
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
)
def export_jsonl(request: HttpRequest, filters: Query[ExportFilters]):
    if filters.include not in ("learned", "reviewed"):
        raise HttpError(422, "include: must be 'learned' or 'reviewed'")
    response = StreamingHttpResponse(
        _export_lines(request.auth, filters), content_type="application/jsonl"
    )
    response["Content-Disposition"] = f'attachment; filename="{request.auth.slug}.jsonl"'
    return response
