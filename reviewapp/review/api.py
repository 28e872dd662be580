"""What a reviewer does in the dashboard, over the API: tag traces, read queues. Keys with the
`review` scope act as one reviewer with no user (a tag's reviewer stays empty), as tags sent
with ingested traces do."""

from datetime import datetime

from django.db.models import Prefetch
from django.http import Http404, HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError
from pydantic import field_validator

from reviewapp.api.pagination import decode_cursor, page_of
from reviewapp.api.schemas import ERRORS
from reviewapp.projects.access import first_or_404
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope
from reviewapp.review.models import Queue, QueueItem, QueueReview
from reviewapp.review.queues import with_progress
from reviewapp.review.tags import add_tag, remove_tag
from reviewapp.traces.access import get_trace_for_project
from reviewapp.traces.models import Tag, TraceTag

router = Router(tags=["review"])

READ = (KeyScope.REVIEW, KeyScope.ADMIN)
MAX_TAG_NAME = Tag._meta.get_field("name").max_length


# Tags on a trace


def _tag_name_problem(name: str) -> str | None:
    if not name.strip() or len(name) > MAX_TAG_NAME:
        return f"tag {name[:40]!r} must be 1-{MAX_TAG_NAME} characters"
    if "\x00" in name:
        return "a tag name contains a NUL character (\\u0000), which cannot be stored"
    return None


class TagChangesIn(Schema):
    add: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="tag names; one not in the taxonomy yet is added to it",
    )
    remove: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="tag names; only tags put on by API keys or ingest are taken off "
        "(a person's tag is theirs, as in the dashboard)",
    )

    @field_validator("add", "remove")
    @classmethod
    def names(cls, names: list[str]) -> list[str]:
        for name in names:
            if problem := _tag_name_problem(name):
                raise ValueError(problem)
        return list(dict.fromkeys(name.strip() for name in names))


class TraceTagsOut(Schema):
    tags: list[str]  # every tag now on the trace, whoever put it there
    added: list[str]
    removed: list[str]


@router.post(
    "/traces/{external_id}/tags",
    response={200: TraceTagsOut, **ERRORS},
    summary="Add and remove tags on a trace",
    **requires(KeyScope.REVIEW),
)
def change_trace_tags(request: HttpRequest, external_id: str, changes: TagChangesIn):
    """Idempotent: adding a tag that is on, or removing one that is off, changes nothing.
    A name both added and removed is refused."""
    project = request.auth
    trace = get_trace_for_project(project, external_id)
    if both := set(changes.add) & set(changes.remove):
        raise HttpError(422, f"tag {sorted(both)[0]!r} is both added and removed")
    known = {tag.name: tag for tag in Tag.objects.filter(project=project, name__in=changes.remove)}
    if unknown := [name for name in changes.remove if name not in known]:
        raise Http404(f"no tag {unknown[0]!r} in this project's taxonomy")
    removed = [name for name in changes.remove if remove_tag(trace=trace, tag=known[name])]
    added = []
    for name in changes.add:
        tag, _ = Tag.objects.get_or_create(project=project, name=name)
        if add_tag(trace=trace, tag=tag):
            added.append(name)
    on_trace = TraceTag.objects.filter(trace=trace).values_list("tag__name", flat=True)
    return {"tags": sorted(set(on_trace)), "added": added, "removed": removed}


# Queues


class QueueOut(Schema):
    id: int
    name: str
    filter_query: str  # the trace list's query string the queue was built from
    reviewers_per_item: int
    blind: bool
    items: int
    fully_reviewed: int  # items with reviewers_per_item reviews done
    created_at: datetime


class QueueListOut(Schema):
    queues: list[QueueOut]


class QueueReviewOut(Schema):
    reviewer: str
    status: str  # reserved / done / skipped
    done_at: datetime | None


class QueueItemOut(Schema):
    position: int
    trace: str  # the trace's external_id
    reviews: list[QueueReviewOut]


class QueueItemListOut(Schema):
    items: list[QueueItemOut]
    next: str | None


class PageIn(Schema):
    limit: int = Field(100, ge=1, le=500)
    cursor: str | None = None


@router.get(
    "/queues",
    response={200: QueueListOut, **ERRORS},
    summary="Review queues, newest first, with their progress",
    **requires(*READ),
)
def list_queues(request: HttpRequest):
    queues = with_progress(Queue.objects.filter(project=request.auth)).order_by("-id")
    return {
        "queues": [
            {
                "id": queue.pk,
                "name": queue.name,
                "filter_query": queue.filter_query,
                "reviewers_per_item": queue.reviewers_per_item,
                "blind": queue.blind,
                "items": queue.item_count,
                "fully_reviewed": queue.done_count,
                "created_at": queue.created_at,
            }
            for queue in queues
        ]
    }


@router.get(
    "/queues/{queue_id}/items",
    response={200: QueueItemListOut, **ERRORS},
    summary="A queue's items in order, with each reviewer's claim on them",
    **requires(*READ),
)
def list_queue_items(request: HttpRequest, queue_id: int, page: Query[PageIn]):
    queue = first_or_404(
        Queue.objects.filter(project=request.auth, pk=queue_id),
        f"no queue {queue_id} in this project",
    )
    items = (
        QueueItem.objects.filter(queue=queue)
        .select_related("trace")
        .only("position", "trace__external_id")
        .prefetch_related(
            Prefetch(
                "reviews", QueueReview.objects.select_related("reviewer").order_by("reviewer_id")
            )
        )
        .order_by("position")
    )
    if page.cursor:
        items = items.filter(position__gt=decode_cursor(page.cursor))
    rows, next_cursor = page_of(items, page.limit, key=lambda item: item.position)
    return {
        "items": [
            {
                "position": item.position,
                "trace": item.trace.external_id,
                "reviews": [
                    {
                        "reviewer": review.reviewer.get_username(),
                        "status": review.status,
                        "done_at": review.done_at,
                    }
                    for review in item.reviews.all()
                ],
            }
            for item in rows
        ],
        "next": next_cursor,
    }
