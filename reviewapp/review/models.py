"""Reviewers' work on traces: feedback, queues and their reviews (tags are stored with the traces,
reviewapp/traces/models.py; review/tags.py curates the taxonomy)."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from reviewapp.projects.models import ApiKey, Project
from reviewapp.traces.models import Trace


class FeedbackStatus(models.TextChoices):
    OPEN = "open"  # waiting to become targets
    USED = "used"  # targets were built from it
    DISMISSED = "dismissed"
    FAILED = "failed"  # the model could not use it (failure_reason says why); an admin retries


class Feedback(models.Model):
    """Written feedback pinned to a trace, one assistant turn, or one tool call."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="feedback")
    # 0-based index in the trace's messages of the assistant turn; null: the whole trace.
    turn = models.IntegerField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=200, blank=True)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    author = models.CharField(max_length=200, blank=True)  # who wrote it, as the API was told
    # The key that sent it over the API (null: written in the dashboard); `author` is only a claim.
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="feedback"
    )
    # False when an API key without the review scope sent it (a harness, an end user): then its
    # correction, and revisions passing its checks, are proposals a reviewer must approve.
    # True from the dashboard (reviewers only) and from keys with the review scope.
    from_reviewer = models.BooleanField(default=False)
    text = models.TextField()
    rating = models.FloatField(null=True, blank=True)
    # A corrected assistant message (OpenAI shape); the strongest training target.
    correction = models.JSONField(null=True, blank=True)
    # Machine-checkable expectations on the turn: [{"kind": ..., "value": ...}].
    checks = models.JSONField(default=list, blank=True)
    status = models.CharField(
        max_length=16, choices=FeedbackStatus.choices, default=FeedbackStatus.OPEN
    )
    # Why the model could not use it (status failed): too long for its context, a teacher error.
    failure_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # sha256 of (anchor, author, text, rating, correction, checks): a resent feedback is one row.
    content_hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trace", "content_hash"], name="feedback_once"),
        ]

    def __str__(self) -> str:
        return f"feedback on {self.trace_id} turn {self.turn}"

    @property
    def sender(self) -> str:
        """Who sent it as far as the product knows: the key or the person, never the claimed
        `author` (select_related "api_key" and "reviewer" where many are shown)."""
        if self.api_key_id:
            return f"via key {self.api_key.name or self.api_key.prefix}"
        if self.reviewer_id:
            return self.reviewer.get_username()
        return "unknown sender"


class Queue(models.Model):
    """Traces picked by a filter for reviewers to work through together."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="queues")
    name = models.CharField(max_length=200)
    # The trace-list query string the queue was built from, so it can be read and rebuilt.
    filter_query = models.CharField(max_length=2000, blank=True)
    reviewers_per_item = models.PositiveSmallIntegerField(default=1)
    # Blind: a reviewer sees nobody else's tags or feedback on an item until they finish it.
    blind = models.BooleanField(default=False)
    # What reviewers of this queue should look for, written by an admin; shown, as text, on
    # every item opened from the queue.
    guidelines = models.TextField(blank=True)
    assignees = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class QueueItem(models.Model):
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="items")
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="queue_items")
    position = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "trace"], name="queueitem_once"),
        ]
        # serves: "next item for me" walks a queue in order
        indexes = [models.Index(fields=["queue", "position"], name="queueitem_order")]

    def __str__(self) -> str:
        return f"{self.queue_id}#{self.position}"


class ReviewStatus(models.TextChoices):
    RESERVED = "reserved"
    DONE = "done"
    SKIPPED = "skipped"


class QueueReview(models.Model):
    """One reviewer's claim on, and then work on, one queue item."""

    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="queue_reviews"
    )
    status = models.CharField(
        max_length=16, choices=ReviewStatus.choices, default=ReviewStatus.RESERVED
    )
    # A reservation nobody finishes expires, so an item is never stuck with an absent reviewer.
    reserved_until = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "reviewer"], name="queuereview_once"),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer} {self.status} {self.item}"


class CopiedFeedback(models.Model):
    """Where a feedback came from when a reviewer applied it to a similar trace they confirmed."""

    feedback = models.OneToOneField(Feedback, on_delete=models.CASCADE, related_name="copied_from")
    source = models.ForeignKey(
        Feedback, null=True, on_delete=models.SET_NULL, related_name="copies"
    )
    similarity = models.FloatField()  # cosine similarity of the two traces when confirmed
    confirmed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"feedback {self.feedback_id} copied from {self.source_id}"


class DeletedFeedback(models.Model):
    """A feedback its author deleted from the trace page, kept as its rows for a while so "Undo"
    puts it back exactly: the same id, its targets, and what it was copied from or to."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="+")
    deleted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    # {"feedback": id, "rows": Django's JSON serialization of the feedback, its targets and its
    # CopiedFeedback, "copies": ids of the CopiedFeedback rows whose source the delete cleared}.
    snapshot = models.JSONField()
    deleted_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"deleted feedback {self.snapshot.get('feedback')}"
