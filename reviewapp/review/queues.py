"""Review queues: building one from the trace filters, claiming items, finishing them."""

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import (
    Case,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from reviewapp.projects.models import Project
from reviewapp.review.models import Queue, QueueItem, QueueReview, ReviewStatus
from reviewapp.traces.filters import filtered_traces
from reviewapp.traces.models import Trace

# More than this is a backlog, not a queue; sample it down instead.
MAX_QUEUE_ITEMS = 5000
# A claim nobody finishes frees itself after this long.
RESERVATION = timedelta(minutes=30)
GUIDELINES_MAX_CHARS = 10_000  # a page of instructions, not a manual


class QueueError(Exception):
    """A queue request that cannot be met; the message is shown to the person who made it."""


@transaction.atomic
def build_queue(
    *,
    project: Project,
    name: str,
    filters: dict,
    filter_query: str,
    sample_size: int | None,
    seed: int | None,
    reviewers_per_item: int,
    blind: bool,
    assignees: list,
    created_by,
) -> Queue:
    """A queue of the traces matching `filters` (cleaned TraceFilterForm data), in list order.

    With `sample_size`, a uniform random sample of them (reproducible with `seed`), still in
    list order. Only trace ids are read, never bodies.
    """
    if reviewers_per_item < 1:
        raise QueueError("each item needs at least one reviewer")
    if assignees and reviewers_per_item > len(assignees):
        raise QueueError(
            f"{reviewers_per_item} reviewers per item, but only {len(assignees)} assigned"
        )
    if sample_size is not None and not 1 <= sample_size <= MAX_QUEUE_ITEMS:
        raise QueueError(f"a sample is between 1 and {MAX_QUEUE_ITEMS} traces")
    if len(filter_query) > Queue._meta.get_field("filter_query").max_length:
        raise QueueError("these filters are too long to store with the queue")
    matching = filtered_traces(project, filters).values_list("id", flat=True)
    # Without a sample, one row past the cap is enough to know the queue would be too big.
    trace_ids = list(matching if sample_size is not None else matching[: MAX_QUEUE_ITEMS + 1])
    if not trace_ids:
        raise QueueError("no traces match these filters")
    if sample_size is not None and sample_size < len(trace_ids):
        chosen = set(random.Random(seed).sample(trace_ids, sample_size))
        trace_ids = [trace_id for trace_id in trace_ids if trace_id in chosen]
    if len(trace_ids) > MAX_QUEUE_ITEMS:
        raise QueueError(
            f"more than {MAX_QUEUE_ITEMS} traces match, more than a queue holds: "
            "narrow the filters or take a sample"
        )
    queue = Queue.objects.create(
        project=project,
        name=name,
        filter_query=filter_query,
        reviewers_per_item=reviewers_per_item,
        blind=blind,
        created_by=created_by,
    )
    queue.assignees.set(assignees)
    QueueItem.objects.bulk_create(
        QueueItem(queue=queue, trace_id=trace_id, position=position)
        for position, trace_id in enumerate(trace_ids, start=1)
    )
    return queue


@transaction.atomic
def add_traces_to_queue(*, queue: Queue, traces: list[Trace]) -> int:
    """Append the traces to the end of the queue, in the order given, all or none (the trace
    list's bulk action); one already in it keeps its place. Returns how many were added."""
    if any(trace.project_id != queue.project_id for trace in traces):
        raise QueueError("a queue holds traces of its own project only")
    # Locked so that two additions at once do not hand out the same positions.
    Queue.objects.select_for_update().filter(pk=queue.pk).first()
    present = set(
        QueueItem.objects.filter(queue=queue, trace__in=traces).values_list("trace_id", flat=True)
    )
    new = list({trace.pk: trace for trace in traces if trace.pk not in present}.values())
    held = queue.items.count()
    if held + len(new) > MAX_QUEUE_ITEMS:
        raise QueueError(
            f"“{queue.name}” holds {held} of the {MAX_QUEUE_ITEMS} traces a queue can; "
            f"{len(new)} more would not fit"
        )
    last = queue.items.aggregate(last=Max("position"))["last"] or 0
    QueueItem.objects.bulk_create(
        QueueItem(queue=queue, trace=trace, position=position)
        for position, trace in enumerate(new, start=last + 1)
    )
    return len(new)


def _claims_by_others(reviewer, now: datetime) -> Q:
    """Reviews that take one of an item's N places: done, or reserved and not yet expired."""
    return (
        Q(status=ReviewStatus.DONE) | Q(status=ReviewStatus.RESERVED, reserved_until__gt=now)
    ) & ~Q(reviewer=reviewer)


def _open_items(queue: Queue, reviewer, now: datetime) -> QuerySet[QueueItem]:
    """Items this reviewer has not finished or skipped, with a place left, first in line first."""
    finished = QueueReview.objects.filter(
        item=OuterRef("pk"),
        reviewer=reviewer,
        status__in=[ReviewStatus.DONE, ReviewStatus.SKIPPED],
    )
    taken = (
        QueueReview.objects.filter(_claims_by_others(reviewer, now), item=OuterRef("pk"))
        .values("item")
        .annotate(count=Count("pk"))
        .values("count")
    )
    return (
        QueueItem.objects.filter(queue=queue)
        .exclude(Exists(finished))
        .annotate(taken=Coalesce(Subquery(taken, output_field=IntegerField()), 0))
        .filter(taken__lt=queue.reviewers_per_item)
        .order_by("position")
    )


@transaction.atomic
def reserve_next_item(*, queue: Queue, reviewer, now: datetime | None = None) -> QueueItem | None:
    """The reviewer's current item: their unexpired reservation, else a newly claimed one.

    Race-safe on PostgreSQL: the candidate item row is locked (others skip it, or wait when
    nothing else is open) and its places are counted again under the lock, in a fresh snapshot,
    before the claim is written. The recount matters: a competitor's claim may have committed
    after the first statement's snapshot. SQLite serialises writers instead. None when nothing
    is left for this reviewer.
    """
    now = now or timezone.now()
    own = (
        QueueReview.objects.filter(
            item__queue=queue,
            reviewer=reviewer,
            status=ReviewStatus.RESERVED,
            reserved_until__gt=now,
        )
        .select_related("item")
        .order_by("item__position")
        .first()
    )
    if own is not None:
        return own.item
    passed_over: set[int] = set()
    while True:
        candidates = _open_items(queue, reviewer, now).exclude(pk__in=passed_over)
        # Take a free item without waiting; if every open item is being claimed right now,
        # wait for the first one, which may still have a place once its claim commits.
        item = (
            candidates.select_for_update(skip_locked=True, of=("self",)).first()
            or candidates.select_for_update(of=("self",)).first()
        )
        if item is None:
            return None
        taken = QueueReview.objects.filter(_claims_by_others(reviewer, now), item=item).count()
        if taken < queue.reviewers_per_item:
            break
        passed_over.add(item.pk)
    QueueReview.objects.update_or_create(
        item=item,
        reviewer=reviewer,
        defaults={"status": ReviewStatus.RESERVED, "reserved_until": now + RESERVATION},
    )
    return item


@transaction.atomic
def finish_item(*, item: QueueItem, reviewer) -> QueueReview:
    """Mark the reviewer's claim on the item done; finishing twice changes nothing."""
    review = QueueReview.objects.select_for_update().filter(item=item, reviewer=reviewer).first()
    if review is None:
        raise QueueError("this item was not reserved for you; open the queue's next item")
    if review.status != ReviewStatus.DONE:
        review.status = ReviewStatus.DONE
        review.done_at = timezone.now()
        review.save(update_fields=["status", "done_at"])
    return review


@transaction.atomic
def skip_item(*, item: QueueItem, reviewer) -> QueueReview:
    """Give the item up: it is not served to this reviewer again and frees their place."""
    review, _ = QueueReview.objects.select_for_update().get_or_create(
        item=item,
        reviewer=reviewer,
        defaults={"status": ReviewStatus.SKIPPED, "reserved_until": timezone.now()},
    )
    if review.status == ReviewStatus.RESERVED:
        review.status = ReviewStatus.SKIPPED
        review.save(update_fields=["status"])
    return review


@dataclass(frozen=True)
class ReviewerProgress:
    reviewer: object  # a User
    done: int
    skipped: int


@dataclass(frozen=True)
class QueueProgress:
    total: int  # items in the queue
    fully_done: int  # items with reviewers_per_item done reviews
    # Done reviews that fill an item's places (at most reviewers_per_item each), of all places:
    # with two reviewers per item, half of every item's work shows before any item is complete.
    reviews_done: int
    reviews_needed: int
    reviewers: list[ReviewerProgress]  # assignees first, then anyone else who worked it


def queue_progress(queue: Queue) -> QueueProgress:
    """How far the queue is: items fully reviewed, reviews done of those needed, and each
    reviewer's count."""
    places = queue.reviewers_per_item
    items = QueueItem.objects.filter(queue=queue).annotate(
        done=Count("reviews", filter=Q(reviews__status=ReviewStatus.DONE))
    )
    total = items.count()
    fully_done = items.filter(done__gte=places).count() if total else 0
    reviews_done = sum(min(done, places) for done in items.values_list("done", flat=True))
    counts: dict[int, dict[str, int]] = {}
    for row in (
        QueueReview.objects.filter(item__queue=queue)
        .values("reviewer", "status")
        .annotate(count=Count("pk"))
    ):
        counts.setdefault(row["reviewer"], {})[row["status"]] = row["count"]
    people = list(queue.assignees.order_by("username"))
    known = {person.pk for person in people}
    others = get_user_model().objects.filter(pk__in=set(counts) - known).order_by("username")
    reviewers = [
        ReviewerProgress(
            reviewer=person,
            done=counts.get(person.pk, {}).get(ReviewStatus.DONE, 0),
            skipped=counts.get(person.pk, {}).get(ReviewStatus.SKIPPED, 0),
        )
        for person in [*people, *others]
    ]
    return QueueProgress(
        total=total,
        fully_done=fully_done,
        reviews_done=reviews_done,
        reviews_needed=total * places,
        reviewers=reviewers,
    )


# A lead's view of a queue: each item's state, from its reviews.
OPEN, RESERVED, DONE, SKIPPED = "open", "reserved", "done", "skipped"
ITEM_STATES = (OPEN, RESERVED, DONE, SKIPPED)


@dataclass(frozen=True)
class ItemRow:
    item: QueueItem  # with `external_id`, its trace's
    state: str  # done: every place done; reserved: someone holds it; skipped: skipped, unheld
    holders: list[QueueReview]  # unexpired reservations, with their reviewer and expiry
    done_by: list  # Users
    skipped_by: list


def _item_states(queue: Queue, now: datetime) -> QuerySet[QueueItem]:
    """The queue's items, in order, annotated with `state` (one of ITEM_STATES)."""
    places = queue.reviewers_per_item
    held = Q(reviews__status=ReviewStatus.RESERVED, reviews__reserved_until__gt=now)
    return (
        QueueItem.objects.filter(queue=queue)
        .annotate(
            done=Count("reviews", filter=Q(reviews__status=ReviewStatus.DONE)),
            held=Count("reviews", filter=held),
            skipped=Count("reviews", filter=Q(reviews__status=ReviewStatus.SKIPPED)),
        )
        .annotate(
            state=Case(
                When(done__gte=places, then=Value(DONE)),
                When(held__gt=0, then=Value(RESERVED)),
                When(skipped__gt=0, then=Value(SKIPPED)),
                default=Value(OPEN),
            ),
            external_id=F("trace__external_id"),
        )
        .order_by("position")
    )


def queue_items(
    *, queue: Queue, state: str = "", offset: int = 0, limit: int = 100, now=None
) -> tuple[list[ItemRow], dict[str, int]]:
    """One page of the queue's items (in `state`, or all) with who holds, finished or skipped
    each, and how many items are in each state. Two queries for the items, one for their
    reviews; never a trace body."""
    now = now or timezone.now()
    items = _item_states(queue, now)
    counts = dict.fromkeys(ITEM_STATES, 0)
    for item_state in items.values_list("state", flat=True):  # a queue holds 5,000 at most
        counts[item_state] += 1
    page = list((items.filter(state=state) if state else items)[offset : offset + limit])
    reviews: dict[int, list[QueueReview]] = {}
    for review in (
        QueueReview.objects.filter(item__in=page).select_related("reviewer").order_by("id")
    ):
        reviews.setdefault(review.item_id, []).append(review)
    rows = []
    for item in page:
        of_item = reviews.get(item.pk, [])
        rows.append(
            ItemRow(
                item=item,
                state=item.state,
                holders=[
                    review
                    for review in of_item
                    if review.status == ReviewStatus.RESERVED and review.reserved_until > now
                ],
                done_by=[r.reviewer for r in of_item if r.status == ReviewStatus.DONE],
                skipped_by=[r.reviewer for r in of_item if r.status == ReviewStatus.SKIPPED],
            )
        )
    return rows, counts


@transaction.atomic
def release_item(*, item: QueueItem, reviewer) -> None:
    """Take the item back from a reviewer who holds it: its place is free for the next one."""
    deleted, _ = QueueReview.objects.filter(
        item=item, reviewer=reviewer, status=ReviewStatus.RESERVED
    ).delete()
    if not deleted:
        raise QueueError(f"{reviewer.get_username()} holds no reservation on this item")


@transaction.atomic
def reassign_item(*, item: QueueItem, to, from_reviewer=None, now=None) -> QueueReview:
    """Reserve the item for `to` (a reviewer of the project), released first from
    `from_reviewer` when given.

    The item row is locked as reserve_next_item locks it, so a reviewer claiming it at the same
    moment waits and then counts this reservation.
    """
    now = now or timezone.now()
    queue = item.queue
    QueueItem.objects.select_for_update(of=("self",)).filter(pk=item.pk).first()
    if queue.assignees.exists() and not queue.assignees.filter(pk=to.pk).exists():
        raise QueueError(f"{to.get_username()} is not one of this queue's assignees")
    if from_reviewer is not None:
        release_item(item=item, reviewer=from_reviewer)
    own = QueueReview.objects.filter(item=item, reviewer=to).first()
    if own is not None and own.status == ReviewStatus.DONE:
        raise QueueError(f"{to.get_username()} has already reviewed this item")
    taken = QueueReview.objects.filter(_claims_by_others(to, now), item=item).count()
    if taken >= queue.reviewers_per_item:
        raise QueueError("every place on this item is taken: release a holder first")
    review, _ = QueueReview.objects.update_or_create(
        item=item,
        reviewer=to,
        defaults={"status": ReviewStatus.RESERVED, "reserved_until": now + RESERVATION},
    )
    return review


def with_progress(queues: QuerySet[Queue]) -> QuerySet[Queue]:
    """Queues annotated with `item_count`, `done_count` (fully reviewed items), `reviews_done`
    and `reviews_needed`, in one query."""
    done_reviews = (
        QueueReview.objects.filter(item=OuterRef("pk"), status=ReviewStatus.DONE)
        .values("item")
        .annotate(count=Count("pk"))
        .values("count")
    )
    fully_done_items = (
        QueueItem.objects.filter(queue=OuterRef("pk"))
        .annotate(done=Coalesce(Subquery(done_reviews, output_field=IntegerField()), 0))
        .filter(done__gte=OuterRef("reviewers_per_item"))
        .values("queue")
        .annotate(count=Count("pk"))
        .values("count")
    )
    items = (
        QueueItem.objects.filter(queue=OuterRef("pk"))
        .values("queue")
        .annotate(count=Count("pk"))
        .values("count")
    )
    reviews = (
        QueueReview.objects.filter(item__queue=OuterRef("pk"), status=ReviewStatus.DONE)
        .values("item__queue")
        .annotate(count=Count("pk"))
        .values("count")
    )
    return queues.annotate(
        item_count=Coalesce(Subquery(items, output_field=IntegerField()), 0),
        done_count=Coalesce(Subquery(fully_done_items, output_field=IntegerField()), 0),
        # The progress bar's: done reviews of the places all items have (see QueueProgress).
        reviews_done=Coalesce(Subquery(reviews, output_field=IntegerField()), 0),
        reviews_needed=ExpressionWrapper(
            F("item_count") * F("reviewers_per_item"), output_field=IntegerField()
        ),
    )


def blinds_reviewer(*, trace, reviewer) -> bool:
    """Whether others' tags and feedback on the trace are hidden from this reviewer for now.

    True while they hold an unfinished claim on it in a blind queue (expired or not): their
    judgement should be their own until they mark it done.
    """
    return QueueReview.objects.filter(
        item__trace=trace,
        item__queue__blind=True,
        reviewer=reviewer,
        status=ReviewStatus.RESERVED,
    ).exists()


def set_queue_guidelines(*, queue: Queue, guidelines: str) -> Queue:
    """What the queue's reviewers should look for; shown as text on every item of it."""
    if len(guidelines) > GUIDELINES_MAX_CHARS:
        raise QueueError(f"guidelines are at most {GUIDELINES_MAX_CHARS} characters")
    queue.guidelines = guidelines
    queue.save(update_fields=["guidelines"])
    return queue
