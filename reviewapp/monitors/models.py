"""The monitors' data: triage rules and matches, trace embeddings, and the requests
the gateway refused."""

from django.conf import settings
from django.db import models
from django.utils import timezone
from pgvector.django import VectorField

from reviewapp.projects.models import Project
from reviewapp.review.models import Queue
from reviewapp.traces.models import Tag, Termination, Trace, TraceOutcome


class TriageRule(models.Model):
    """Routes the traces matching every set condition to a queue, a deterministic sample of them."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="triage_rules")
    name = models.CharField(max_length=200)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="triage_rules")
    # Conditions; a blank one does not restrict. A rule needs at least one.
    termination = models.CharField(max_length=32, choices=Termination.choices, blank=True)
    min_tool_calls = models.PositiveIntegerField(null=True, blank=True)  # more than this many
    failed_tool = models.CharField(max_length=200, blank=True)  # "*": any tool's call failed
    tag = models.ForeignKey(
        Tag, null=True, blank=True, on_delete=models.CASCADE, related_name="triage_rules"
    )
    model = models.CharField(max_length=200, blank=True)
    adapter_version = models.CharField(max_length=200, blank=True)
    outcome = models.CharField(max_length=16, choices=TraceOutcome.choices, blank=True)
    text = models.CharField(max_length=200, blank=True)  # case-insensitive, in any message
    # The share of matching traces routed, decided by a hash of (rule, trace): re-runs agree.
    sample_rate = models.FloatField(default=1.0)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class TriageMatch(models.Model):
    """A trace a rule matched (once per rule), and whether the sample routed it to the queue."""

    rule = models.ForeignKey(TriageRule, on_delete=models.CASCADE, related_name="matches")
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="triage_matches")
    routed = models.BooleanField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rule", "trace"], name="triagematch_once"),
        ]

    def __str__(self) -> str:
        return f"rule {self.rule_id} matched {self.trace_id}"


class TraceEmbedding(models.Model):
    """A trace's compact text (reviewapp.monitors.embeddings) as an L2-normalised float32 vector."""

    # The project is repeated here so a project's vectors are read without a join.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="embeddings")
    model_name = models.CharField(max_length=200)
    vector = models.BinaryField()  # numpy float32 bytes
    # sha256 of the text embedded: a trace whose text has not changed is not embedded again.
    content_hash = models.CharField(max_length=64)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trace", "model_name"], name="embedding_once"),
        ]
        # serves: a project's vectors, newest first, for similarity and clustering
        indexes = [
            models.Index(fields=["project", "model_name", "-trace"], name="embedding_project"),
        ]

    def __str__(self) -> str:
        return f"{self.model_name} vector of {self.trace_id}"


class TraceVector(models.Model):
    """A TraceEmbedding row seen through its pgvector column, for nearest-neighbour queries.

    Migration 0016 adds the column, with an HNSW index (cosine), only where the database can
    create the `vector` extension; elsewhere (SQLite, a PostgreSQL without pgvector) the column
    is absent and this model is never queried (monitors/similarity.vector_search_available).
    Rows are written as TraceEmbedding; this model only fills in and reads `embedding`.
    """

    trace_id = models.BigIntegerField()
    project_id = models.BigIntegerField()
    model_name = models.CharField(max_length=200)
    embedding = VectorField(dimensions=384, null=True)  # the same vector as TraceEmbedding's

    class Meta:
        managed = False
        db_table = "reviewapp_traceembedding"

    def __str__(self) -> str:
        return f"{self.model_name} vector of {self.trace_id}"


class RefusalReason(models.TextChoices):
    """Why the gateway answered a request itself, before any model server saw it."""

    INVALID_API_KEY = "invalid_api_key"  # no key, or one nobody holds
    INSUFFICIENT_SCOPE = "insufficient_scope"  # a live key without the ingest scope
    MODEL_NOT_FOUND = "model_not_found"  # a model the project does not serve
    INVALID_REQUEST = "invalid_request"  # a body no model server would take


class GatewayRefusal(models.Model):
    """How many requests the gateway refused in one hour, per project and reason: refused
    requests are counted, not stored as traces. A key nobody holds names no project."""

    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    reason = models.CharField(max_length=32, choices=RefusalReason.choices)
    hour = models.DateTimeField()  # the start of the hour the requests came in
    # Several web processes may each add a row for the same hour; readers sum them.
    count = models.PositiveIntegerField(default=0)

    class Meta:
        # serves: a project's refusals over the last hours (monitors, the API)
        indexes = [models.Index(fields=["project", "hour"], name="refusal_by_project")]

    def __str__(self) -> str:
        return f"{self.count} {self.reason} at {self.hour:%Y-%m-%d %H}:00"
