"""Review queues: build one from the trace filters, work through it, compare the reviewers."""

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from reviewapp.fragments import render_page
from reviewapp.projects.access import (
    first_or_404,
    get_admin_membership_for_user,
    get_membership_for_user,
    get_reviewer_membership_for_user,
)
from reviewapp.projects.models import Membership, Role
from reviewapp.review.access import get_queue_for_membership
from reviewapp.review.agreement import tag_agreement
from reviewapp.review.forms import QueueForm
from reviewapp.review.models import Queue, QueueItem, QueueReview, ReviewStatus
from reviewapp.review.queues import (
    GUIDELINES_MAX_CHARS,
    ITEM_STATES,
    MAX_QUEUE_ITEMS,
    QueueError,
    build_queue,
    finish_item,
    queue_items,
    queue_progress,
    reassign_item,
    release_item,
    reserve_next_item,
    set_queue_guidelines,
    skip_item,
    with_progress,
)
from reviewapp.traces.filters import TraceFilterForm, filtered_traces
from reviewapp.traces.models import Tag, TraceTag

# The adjudication list stops here; the agreement numbers still cover every item.
MAX_DISAGREEMENTS_SHOWN = 200
ITEMS_PER_PAGE = 100  # the queue page's item list, a page at a time


def _may_work(queue: Queue, user) -> bool:
    """Assignees, when a queue has any, are the only ones who work it."""
    assignees = queue.assignees.all()
    return not assignees.exists() or assignees.filter(pk=user.pk).exists()


def _get_queue_for_user(user, slug: str, queue_id: int) -> tuple[Membership, Queue]:
    membership = get_membership_for_user(user, slug)
    return membership, get_queue_for_membership(membership, queue_id)


def _get_workable_queue_for_user(user, slug: str, queue_id: int) -> tuple[Membership, Queue]:
    membership = get_reviewer_membership_for_user(user, slug)
    queue = get_queue_for_membership(membership, queue_id)
    if not _may_work(queue, user):
        raise PermissionDenied("this queue is assigned to other reviewers")
    return membership, queue


def _page(membership: Membership, **context) -> dict:
    return {"membership": membership, "project": membership.project, **context}


@require_GET
@login_required
def queue_list(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    queues = with_progress(Queue.objects.filter(project=membership.project)).order_by(
        "-created_at", "-id"
    )
    return render(request, "review/queues.html", _page(membership, queues=queues))


@login_required
def queue_create(request: HttpRequest, slug: str) -> HttpResponse:
    # Admins manage queues (the role model); reviewers work them.
    membership = get_admin_membership_for_user(request.user, slug)
    project = membership.project
    # Opened from the trace list, its query string pre-fills the filters.
    source = request.POST if request.method == "POST" else request.GET
    filter_form = TraceFilterForm(source, project=project)
    filters = filter_form.cleaned_data if filter_form.is_valid() else None
    form = QueueForm(initial=filters or {}, project=project)
    status = 200
    if request.method == "POST":
        form = QueueForm(request.POST, project=project)
        if form.is_valid():
            data = form.cleaned_data
            try:
                queue = build_queue(
                    project=project,
                    name=data["name"],
                    filters=form.filters(),
                    filter_query=form.filter_query(),
                    sample_size=data["sample_size"],
                    seed=data["seed"],
                    reviewers_per_item=data["reviewers_per_item"],
                    blind=data["blind"],
                    assignees=list(data["assignees"]),
                    created_by=request.user,
                )
            except QueueError as error:
                form.add_error(None, str(error))
            else:
                return redirect("queue_detail", slug=slug, queue_id=queue.pk)
        status = 422
    context = _page(
        membership,
        form=form,
        matching=filtered_traces(project, filters).count() if filters is not None else None,
        max_items=MAX_QUEUE_ITEMS,
    )
    return render(request, "review/queue_create.html", context, status=status)


class QueueGuidelinesForm(forms.Form):
    guidelines = forms.CharField(
        required=False,
        max_length=GUIDELINES_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text="Shown, as plain text, on every item opened from this queue.",
    )


def _reviewers_for(queue: Queue) -> QuerySet:
    """Who an item can be given to: the assignees, or else any reviewer of the project."""
    if queue.assignees.exists():
        return queue.assignees.order_by("username")
    return (
        get_user_model()
        .objects.filter(
            memberships__project=queue.project_id,
            memberships__role__in=[Role.ADMIN, Role.REVIEWER],
        )
        .order_by("username")
    )


@require_GET
@login_required
def queue_detail(request: HttpRequest, slug: str, queue_id: int) -> HttpResponse:
    membership, queue = _get_queue_for_user(request.user, slug, queue_id)
    state = request.GET.get("state", "")
    if state and state not in ITEM_STATES:
        return HttpResponseBadRequest(
            f"state must be one of {', '.join(ITEM_STATES)}", content_type="text/plain"
        )
    try:
        page = max(int(request.GET.get("page", "1")), 1)
    except ValueError:
        return HttpResponseBadRequest("page must be a number", content_type="text/plain")
    rows, counts = queue_items(
        queue=queue, state=state, offset=(page - 1) * ITEMS_PER_PAGE, limit=ITEMS_PER_PAGE
    )
    shown = counts[state] if state else sum(counts.values())
    context = _page(
        membership,
        queue=queue,
        progress=queue_progress(queue),
        may_work=membership.can_review and _may_work(queue, request.user),
        items=rows,
        state=state,
        state_counts=counts,
        page=page,
        more=page * ITEMS_PER_PAGE < shown,
        members=list(_reviewers_for(queue)) if membership.is_admin else [],
        guidelines_form=QueueGuidelinesForm(initial={"guidelines": queue.guidelines}),
    )
    return render_page(request, "review/queue.html", context, fragment="queue-progress")


def _get_item_for_admin(user, slug: str, queue_id: int, item_id: int):
    membership = get_admin_membership_for_user(user, slug)
    queue = get_queue_for_membership(membership, queue_id)
    item = first_or_404(
        QueueItem.objects.filter(queue=queue, pk=item_id), "no such item in this queue"
    )
    return membership, queue, item


class _NotAReviewer(Exception):
    """A POST field that should name a reviewer of the project names nobody who is one."""


def _reviewer_named(request: HttpRequest, queue: Queue, field: str):
    """The reviewer of the project the POST field names by id."""
    try:
        user_id = int(request.POST.get(field, ""))
    except ValueError:
        user_id = None
    reviewer = (
        get_user_model()
        .objects.filter(
            pk=user_id,
            memberships__project=queue.project_id,
            memberships__role__in=[Role.ADMIN, Role.REVIEWER],
        )
        .first()
    )
    if reviewer is None:
        raise _NotAReviewer(f"{field} must name a reviewer of this project")
    return reviewer


def _change_item(
    request: HttpRequest, slug: str, queue_id: int, item_id: int, change
) -> HttpResponse:
    """An admin's change to one item, `change(queue, item)`: back to the item on the queue
    page; 400 when a field names no reviewer, 409 when the queue refuses the change."""
    _, queue, item = _get_item_for_admin(request.user, slug, queue_id, item_id)
    try:
        change(queue, item)
    except _NotAReviewer as error:
        return HttpResponseBadRequest(str(error), content_type="text/plain")
    except QueueError as error:
        return HttpResponse(str(error), status=409, content_type="text/plain")
    return redirect(reverse("queue_detail", args=[slug, queue.pk]) + f"#item-{item.pk}")


@require_POST
@login_required
def queue_item_release(request: HttpRequest, slug: str, queue_id: int, item_id: int):
    """An admin takes an item back from the reviewer holding it."""

    def release(queue: Queue, item: QueueItem) -> None:
        release_item(item=item, reviewer=_reviewer_named(request, queue, "reviewer"))

    return _change_item(request, slug, queue_id, item_id, release)


@require_POST
@login_required
def queue_item_reassign(request: HttpRequest, slug: str, queue_id: int, item_id: int):
    """An admin gives an item to a reviewer (from the one holding it, when `from` names one)."""

    def reassign(queue: Queue, item: QueueItem) -> None:
        to = _reviewer_named(request, queue, "member")
        from_reviewer = (
            _reviewer_named(request, queue, "from") if request.POST.get("from") else None
        )
        reassign_item(item=item, to=to, from_reviewer=from_reviewer)

    return _change_item(request, slug, queue_id, item_id, reassign)


@require_POST
@login_required
def queue_guidelines(request: HttpRequest, slug: str, queue_id: int) -> HttpResponse:
    """An admin writes what the queue's reviewers should look for."""
    membership = get_admin_membership_for_user(request.user, slug)
    queue = get_queue_for_membership(membership, queue_id)
    form = QueueGuidelinesForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest(form.errors.as_text(), content_type="text/plain")
    set_queue_guidelines(queue=queue, guidelines=form.cleaned_data["guidelines"])
    return redirect(reverse("queue_detail", args=[slug, queue.pk]) + "#guidelines")


@require_POST
@login_required
def queue_next(request: HttpRequest, slug: str, queue_id: int) -> HttpResponse:
    """Reserve the reviewer's next item (or give back the one they hold) and open it.

    A POST: a reservation is a write, and a link followed by a prefetcher or a crawler must not
    take items from the reviewers.
    """
    membership, queue = _get_workable_queue_for_user(request.user, slug, queue_id)
    return _open_next_item(request, membership, queue)


@require_POST
@login_required
def queue_item_done(request: HttpRequest, slug: str, queue_id: int, item_id: int) -> HttpResponse:
    """Done (or, with action=skip, skipped), then straight on to the next item."""
    membership, queue = _get_workable_queue_for_user(request.user, slug, queue_id)
    item = first_or_404(
        QueueItem.objects.filter(queue=queue, pk=item_id), "no such item in this queue"
    )
    try:
        if request.POST.get("action") == "skip":
            skip_item(item=item, reviewer=request.user)
        else:
            finish_item(item=item, reviewer=request.user)
    except QueueError as error:
        return HttpResponse(str(error), status=409, content_type="text/plain")
    return _open_next_item(request, membership, queue)


def _open_next_item(request: HttpRequest, membership: Membership, queue: Queue) -> HttpResponse:
    """The trace page of the item reserved for this reviewer, or the queue's done page."""
    item = reserve_next_item(queue=queue, reviewer=request.user)
    if item is None and not request.htmx:
        context = _page(membership, queue=queue, progress=queue_progress(queue))
        return render(request, "review/queue_done.html", context)
    if item is None:  # htmx swaps no page in: the queue page shows that all is done
        url = reverse("queue_detail", args=[membership.project.slug, queue.pk])
    else:
        url = reverse("trace_detail", args=[membership.project.slug, item.trace_id])
        url = f"{url}?queue={queue.pk}&item={item.pk}"
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@require_GET
@login_required
def queue_agreement(request: HttpRequest, slug: str, queue_id: int) -> HttpResponse:
    """Per-tag agreement over finished reviews, and the items where reviewers disagree."""
    membership, queue = _get_queue_for_user(request.user, slug, queue_id)
    items, reviewers, assignments = _finished_reviews(queue)
    tags = {tag.pk: tag for tag in Tag.objects.filter(project=membership.project).order_by("name")}
    agreement = tag_agreement(assignments, tags)
    uses = {
        tag_id: sum(tag_id in tag_ids for by in assignments.values() for tag_ids in by.values())
        for tag_id in tags
    }
    disputed = _disagreements(assignments, _visible_items(queue, membership, request.user))
    disagreements = [
        {
            "item": items[item_id],
            "cells": [
                _tags_cell(assignments[item_id].get(user.pk), contested, tags) for user in reviewers
            ],
        }
        for item_id, contested in disputed[:MAX_DISAGREEMENTS_SHOWN]
    ]
    context = _page(
        membership,
        queue=queue,
        reviewers=reviewers,
        rows=[(tag, agreement[tag_id], uses[tag_id]) for tag_id, tag in tags.items()],
        disagreements=disagreements,
        more_disagreements=max(len(disputed) - MAX_DISAGREEMENTS_SHOWN, 0),
    )
    return render(request, "review/queue_agreement.html", context)


def _finished_reviews(queue: Queue) -> tuple[dict[int, QueueItem], list, dict[int, dict]]:
    """Items with done reviews, their reviewers, and item -> reviewer id -> tag ids put on."""
    done = list(
        QueueReview.objects.filter(item__queue=queue, status=ReviewStatus.DONE)
        .select_related("item", "reviewer")
        .order_by("item__position")
    )
    items = {review.item_id: review.item for review in done}
    reviewers = sorted({review.reviewer for review in done}, key=lambda user: user.username)
    assignments: dict[int, dict[int, set[int]]] = {}
    for review in done:
        assignments.setdefault(review.item_id, {})[review.reviewer_id] = set()
    item_of_trace = {item.trace_id: item.pk for item in items.values()}
    for trace_id, reviewer_id, tag_id in TraceTag.objects.filter(
        trace_id__in=item_of_trace, reviewer__in=reviewers
    ).values_list("trace_id", "reviewer_id", "tag_id"):
        by_reviewer = assignments[item_of_trace[trace_id]]
        if reviewer_id in by_reviewer:  # only the reviewers who finished this item count
            by_reviewer[reviewer_id].add(tag_id)
    return items, reviewers, assignments


def _tags_cell(tag_ids: set[int] | None, contested: set[int], tags: dict[int, Tag]) -> list | None:
    """One reviewer's tags on an item as (tag, contested) pairs; None: they did not review it."""
    if tag_ids is None:
        return None
    return [(tag, tag_id in contested) for tag_id, tag in tags.items() if tag_id in tag_ids]


def _visible_items(queue: Queue, membership: Membership, user) -> set[int] | None:
    """Items whose reviews this person may compare; None: all of them.

    In a blind queue, someone who may still review an item sees its reviews only once they
    have finished or skipped it themselves. Admins adjudicate, so they see everything.
    """
    if not queue.blind or membership.is_admin or not membership.can_review:
        return None
    if not _may_work(queue, user):
        return None
    return set(
        QueueReview.objects.filter(item__queue=queue, reviewer=user)
        .exclude(status=ReviewStatus.RESERVED)
        .values_list("item_id", flat=True)
    )


def _disagreements(
    assignments: dict[int, dict[int, set[int]]], visible: set[int] | None
) -> list[tuple[int, set[int]]]:
    """(item, disputed tags) for items whose reviewers did not all put on the same tags."""
    disputed = []
    for item_id, by_reviewer in assignments.items():
        if len(by_reviewer) < 2 or (visible is not None and item_id not in visible):
            continue
        tag_sets = list(by_reviewer.values())
        contested = set().union(*tag_sets) - set.intersection(*tag_sets)
        if contested:
            disputed.append((item_id, contested))
    return disputed


def queue_context(request: HttpRequest, membership: Membership, trace) -> dict:
    """The queue an item page was opened from, for the trace page.

    Empty unless ?queue=&item= name an item of this trace, in a queue of this project, that
    this user holds or has finished.
    """
    try:
        queue_id, item_id = int(request.GET["queue"]), int(request.GET["item"])
    except (KeyError, ValueError):
        return {}
    item = (
        QueueItem.objects.select_related("queue")
        .filter(pk=item_id, queue_id=queue_id, queue__project=membership.project, trace=trace)
        .first()
    )
    review = (
        QueueReview.objects.filter(item=item, reviewer=request.user)
        .exclude(status=ReviewStatus.SKIPPED)
        .first()
        if item is not None
        else None
    )
    if review is None:
        return {}
    finished = review.status == ReviewStatus.DONE
    return {
        "queue": item.queue,
        "queue_item": item,
        "queue_size": item.queue.items.count(),
        "queue_item_finished": finished,
        # While the item is held, the next item is this one again: "Done, next" moves on.
        "next_item_url": reverse("queue_next", args=[membership.project.slug, item.queue_id])
        if finished
        else "",
    }
