"""The data model: projects and their keys, traces, the tag taxonomy, feedback, queues, calls."""

import hashlib
import secrets
import zlib

import orjson
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from pgvector.django import VectorField


class Project(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # The model the adapters are trained from (a registry name or an HF model directory).
    base_model = models.CharField(max_length=300, default="SmolLM2-135M-Instruct")
    # The model name the harness asks the gateway for; resolved to the base or an adapter.
    served_model = models.CharField(max_length=200, default="SmolLM2-135M-Instruct")
    # The OpenAI-compatible server the gateway forwards to; blank: the configured default.
    upstream_url = models.URLField(max_length=500, blank=True)
    # The name the upstream serves the base model under; blank: the same as served_model.
    upstream_model = models.CharField(max_length=200, blank=True)
    # Training policy and other per-project knobs, validated where they are used.
    settings = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.slug


class KeyScope(models.TextChoices):
    """What an API key may do; a route needs one of the scopes it names (docs/reliability.md)."""

    INGEST = "ingest", "ingest: the gateway, traces, outcomes and end-user feedback"
    REVIEW = "review", "review: feedback whose corrections are approved targets, new tags, alerts"
    ADMIN = "admin", "admin: retrain, runs, adapters and export"


def default_key_scopes() -> list[str]:
    """A key made without naming scopes does what a harness needs and cannot change the model."""
    return [KeyScope.INGEST.value]


class ApiKey(models.Model):
    """A machine credential for one project. Only a hash of the secret is stored."""

    PREFIX_LENGTH = 12

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=PREFIX_LENGTH)  # shown in lists to tell keys apart
    secret_hash = models.CharField(max_length=64, unique=True)  # serves: lookup on every request
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    scopes = models.JSONField(default=default_key_scopes)  # KeyScope values

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.project.slug})"

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    @staticmethod
    def new_secret() -> str:
        return "apk_" + secrets.token_urlsafe(32)

    @staticmethod
    def hash_secret(secret: str) -> str:
        # The secret has 256 bits of entropy, so a fast hash is enough (no password stretching).
        return hashlib.sha256(secret.encode()).hexdigest()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Termination(models.TextChoices):
    COMPLETED = "completed"
    TRUNCATED = "truncated"  # a reply was cut at max_tokens (finish_reason "length")
    TIMEOUT = "timeout"
    TOOL_ERROR = "tool_error"
    MAX_STEPS = "max_steps"
    ERROR = "error"
    CLIENT_DISCONNECTED = "client_disconnected"
    UNKNOWN = "unknown"


class TraceSource(models.TextChoices):
    API = "api"
    OTEL = "otel"
    GATEWAY = "gateway"
    IMPORT = "import"


class Trace(models.Model):
    """One agent episode. Bodies are stored compressed; lists read only the summary columns."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="traces")
    external_id = models.CharField(max_length=256)
    source = models.CharField(max_length=16, choices=TraceSource.choices)
    model = models.CharField(max_length=200, blank=True)
    adapter_version = models.CharField(max_length=200, blank=True)
    termination = models.CharField(
        max_length=32, choices=Termination.choices, default=Termination.UNKNOWN
    )
    reward = models.FloatField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    prompt_tokens = models.IntegerField(null=True, blank=True)
    completion_tokens = models.IntegerField(null=True, blank=True)
    # Summary columns, computed at ingest, so a list never opens a body.
    message_count = models.IntegerField(default=0)
    tool_call_count = models.IntegerField(default=0)
    preview = models.CharField(max_length=300, blank=True)
    # Assistant answers and tool errors, for the text filter (trigram index, migration 0013).
    search_text = models.TextField(blank=True, default="")
    # Facts the monitors aggregate (reviewapp/services/facts.py), exact over every trace.
    tool_results = models.JSONField(default=dict, blank=True)  # tool name -> results
    tool_errors = models.JSONField(default=dict, blank=True)  # tool name -> error results
    tool_result_count = models.IntegerField(default=0)
    tool_error_count = models.IntegerField(default=0)
    answer_count = models.IntegerField(default=0)  # assistant turns with text, no tool call
    answer_words = models.IntegerField(default=0)  # words in those answers
    truncated_replies = models.IntegerField(default=0)  # replies cut at max_tokens
    # zlib-compressed JSON {"messages": [...], "tools": [...]}; see `body_json`.
    body = models.BinaryField()
    # sha256 of the canonical item as received: tells an unchanged replay from a conflict.
    content_hash = models.CharField(max_length=64)
    # Gateway traces: hash of the conversation so far, so a call extending it joins this trace.
    tail_hash = models.CharField(max_length=64, blank=True)
    # Gateway traces: sha256 of the JSON of the last request whose messages are all the trace's
    # (see reviewapp.services.calls._fingerprint), so the next call finds it without hashing
    # its whole history canonically.
    sent_hash = models.CharField(max_length=64, blank=True)
    # The gateway recorder's bookkeeping, so a call appends without reading the body:
    # "segments": TraceSegment rows holding messages recorded since the body was last packed,
    # "tools": the trace's tool definitions (they live here while it is recorded),
    # "error_chars": length of the tool-error part that leads `search_text`.
    recording = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Ingest is idempotent on this pair.
            models.UniqueConstraint(fields=["project", "external_id"], name="trace_external_id"),
        ]
        indexes = [
            # serves: the newest-first list per project (keyset pagination on id)
            models.Index(fields=["project", "-id"], name="trace_project_newest"),
            # serves: the list filtered by source
            models.Index(fields=["project", "source", "-id"], name="trace_project_source"),
            # serve: the dashboard's filters, newest first
            models.Index(fields=["project", "termination", "-id"], name="trace_termination"),
            models.Index(fields=["project", "model", "-id"], name="trace_model"),
            models.Index(fields=["project", "adapter_version", "-id"], name="trace_adapter"),
            models.Index(fields=["project", "received_at"], name="trace_received"),
            # serves: the "most messages" sort
            models.Index(fields=["project", "-message_count", "-id"], name="trace_longest"),
            # serves: the monitors' errors per tool and newest failing traces (failing rows only)
            models.Index(
                fields=["project", "model", "adapter_version", "-id"],
                name="trace_tool_errors",
                condition=Q(tool_error_count__gt=0),
            ),
            # serves: the gateway's prefix merging (which recent trace does this call extend?)
            models.Index(
                fields=["project", "tail_hash"],
                name="trace_tail",
                condition=~Q(tail_hash=""),
            ),
            # serves: the same, for a call that re-sends its history unchanged
            models.Index(
                fields=["project", "sent_hash"],
                name="trace_sent",
                condition=~Q(sent_hash=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.external_id}"

    @staticmethod
    def pack_body(*, messages: list, tools: list) -> bytes:
        return zlib.compress(orjson.dumps({"messages": messages, "tools": tools}), 1)

    def body_json(self) -> dict:
        """{"messages", "tools"}: the packed body plus what the gateway appended since."""
        body = (
            orjson.loads(zlib.decompress(bytes(self.body)))
            if self.body
            else {"messages": [], "tools": []}
        )
        recording = self.recording or {}
        if "tools" in recording:
            body["tools"] = recording["tools"]
        if recording.get("segments"):
            for blob in self.segments.order_by("id").values_list("messages", flat=True):
                body["messages"].extend(orjson.loads(zlib.decompress(bytes(blob))))
        return body


class TraceSegment(models.Model):
    """Messages one gateway call added to its trace, stored once: a long episode costs each
    call its new messages, not the whole conversation again. When the episode goes quiet the
    segments are packed into the trace's body (reviewapp.services.calls.pack_trace_body)."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="segments")
    messages = models.BinaryField()  # zlib-compressed JSON list, in conversation order

    def __str__(self) -> str:
        return f"segment {self.pk} of {self.trace_id}"


class Tag(models.Model):
    """A failure category in a project's taxonomy; `parent` makes it a tree."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=100)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    description = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="tag_name")]

    def __str__(self) -> str:
        return self.name


class TraceTag(models.Model):
    """A tag on a trace, by one reviewer (or by a machine when `reviewer` is empty)."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="trace_tags")
    tag = models.ForeignKey(Tag, on_delete=models.CASCADE, related_name="trace_tags")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["trace", "tag", "reviewer"], name="tracetag_once_per_reviewer"
            ),
            models.UniqueConstraint(
                fields=["trace", "tag"],
                condition=Q(reviewer__isnull=True),
                name="tracetag_once_per_machine",
            ),
        ]
        # serves: the list filtered by tag (EXISTS on tag, trace)
        indexes = [models.Index(fields=["tag", "trace"], name="tracetag_by_tag")]

    def __str__(self) -> str:
        return f"{self.tag_id} on {self.trace_id}"


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


class Role(models.TextChoices):
    ADMIN = "admin"  # manages keys, taxonomy, queues and members
    REVIEWER = "reviewer"  # tags, writes feedback, works queues
    VIEWER = "viewer"  # reads


class Membership(models.Model):
    """A person's role in one project; every dashboard view is scoped through it."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.REVIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_once"),
        ]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.project}"

    @property
    def can_review(self) -> bool:
        return self.role in (Role.ADMIN, Role.REVIEWER)

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN


class Queue(models.Model):
    """Traces picked by a filter for reviewers to work through together."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="queues")
    name = models.CharField(max_length=200)
    # The trace-list query string the queue was built from, so it can be read and rebuilt.
    filter_query = models.CharField(max_length=2000, blank=True)
    reviewers_per_item = models.PositiveSmallIntegerField(default=1)
    # Blind: a reviewer sees nobody else's tags or feedback on an item until they finish it.
    blind = models.BooleanField(default=False)
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


class CallTermination(models.TextChoices):
    COMPLETED = "completed"
    TRUNCATED = "truncated"  # answered, but cut at max_tokens (finish_reason "length")
    ERROR = "error"  # the upstream answered with an error or could not be reached
    TIMEOUT = "timeout"  # the upstream did not answer in time
    CLIENT_DISCONNECTED = "client_disconnected"


class ModelCall(models.Model):
    """One completion call that passed through the gateway, as the upstream saw it."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="calls")
    trace = models.ForeignKey(
        Trace, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls"
    )
    # Index in the trace's messages of the assistant turn this call produced.
    turn_index = models.IntegerField(null=True, blank=True)
    requested_model = models.CharField(max_length=200)
    upstream_model = models.CharField(max_length=200)  # after routing: base or adapter name
    adapter_version = models.CharField(max_length=200, blank=True)
    upstream_url = models.CharField(max_length=500)
    stream = models.BooleanField(default=False)
    # zlib-compressed JSON; the request never holds a credential (headers are not stored).
    # By reference when the call joined a trace: see `request_json`.
    request = models.BinaryField()
    # The request's first N messages are the trace's first N and are not stored again; null:
    # `request` holds the whole request (a call that joined no trace, rows from before).
    request_prefix = models.IntegerField(null=True, blank=True)
    # The request's tools are the trace's first N tool definitions (not stored again).
    request_tools_prefix = models.IntegerField(null=True, blank=True)
    response = models.BinaryField(null=True, blank=True)
    status_code = models.IntegerField(null=True, blank=True)
    termination = models.CharField(max_length=32, choices=CallTermination.choices)
    error = models.TextField(blank=True)
    finish_reason = models.CharField(max_length=32, blank=True)
    started_at = models.DateTimeField()
    latency_ms = models.FloatField()
    time_to_first_token_ms = models.FloatField(null=True, blank=True)
    prompt_tokens = models.IntegerField(null=True, blank=True)
    completion_tokens = models.IntegerField(null=True, blank=True)
    has_token_ids = models.BooleanField(default=False)
    has_logprobs = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["project", "-started_at"], name="call_project_recent")]

    def __str__(self) -> str:
        return f"call {self.pk} to {self.upstream_model}"

    @staticmethod
    def pack(value) -> bytes:
        return zlib.compress(orjson.dumps(value), 1)

    @staticmethod
    def unpack(blob) -> object:
        return orjson.loads(zlib.decompress(bytes(blob))) if blob else None

    def request_json(self) -> dict | None:
        """The request as sent, its shared messages and tools read from the trace (the trace's
        copy of a message the client re-sent with cosmetic changes, such as `content: ""` for
        null). None when the messages it referenced went with a deleted trace."""
        request = self.unpack(self.request)
        if self.request_prefix is None:
            return request
        if self.trace is None:
            return None
        body = self.trace.body_json()
        request["messages"] = body["messages"][: self.request_prefix] + request["messages"]
        if self.request_tools_prefix is not None:
            request["tools"] = body["tools"][: self.request_tools_prefix]
        return request


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


class TraceOutcome(models.TextChoices):
    SUCCESS = "success"
    FAILURE = "failure"
    NONE = "none"  # no outcome reported


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
    """A trace's compact text (see reviewapp.similarity) as an L2-normalised float32 vector."""

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
    is absent and this model is never queried: see services/similarity.vector_search_available.
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


# The learning loop's models live in their own module; importing them here registers them with
# the app and keeps `from reviewapp.models import TrainingRun` working.
from reviewapp.learning.models import (  # noqa: E402, F401
    ACTIVE_RUN_STATUSES,
    Adapter,
    DistillationTarget,
    ModelRoute,
    RunStatus,
    TargetState,
    TrainingRun,
)


class TraceRollup(models.Model):
    """The monitors' counts and sums over a project's traces, per (model, adapter version, hour
    received, termination), kept up to date as traces are written (reviewapp/services/rollups.py)
    so a monitor reads these rows instead of every trace."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200, blank=True)
    adapter_version = models.CharField(max_length=200, blank=True)
    bucket = models.DateTimeField()  # the hour (UTC) the traces were received in
    termination = models.CharField(max_length=32)
    traces = models.IntegerField(default=0)
    first_seen = models.DateTimeField(null=True)  # the earliest received_at among them
    succeeded = models.IntegerField(default=0)  # success True
    unsuccessful = models.IntegerField(default=0)  # success False
    tool_calls = models.BigIntegerField(default=0)
    tokens_total = models.BigIntegerField(default=0)  # completion tokens, where reported
    tokens_reported = models.IntegerField(default=0)
    reward_total = models.FloatField(default=0.0)
    rewarded = models.IntegerField(default=0)
    tool_results = models.BigIntegerField(default=0)
    tool_errors = models.BigIntegerField(default=0)
    answers = models.BigIntegerField(default=0)
    answer_words = models.BigIntegerField(default=0)
    truncated_replies = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # serves: the monitors, which read a project's rows (and the writers' upserts)
            models.UniqueConstraint(
                fields=["project", "model", "adapter_version", "bucket", "termination"],
                name="trace_rollup_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.traces} traces of {self.adapter_version or self.model} at {self.bucket}"


class ToolRollup(models.Model):
    """Tool results and errors per tool, in the same groups as `TraceRollup`."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200, blank=True)
    adapter_version = models.CharField(max_length=200, blank=True)
    bucket = models.DateTimeField()
    termination = models.CharField(max_length=32)
    tool = models.TextField()
    results = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # serves: the monitors' per-tool figures (and the writers' upserts)
            models.UniqueConstraint(
                fields=["project", "model", "adapter_version", "bucket", "termination", "tool"],
                name="tool_rollup_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool}: {self.errors}/{self.results} failed at {self.bucket}"


class RolledUpTrace(models.Model):
    """What the rollups count for one trace: a writer that changes a trace has its old share
    taken out and the new one put in. No foreign key, so a deleted trace's share can still be
    taken out."""

    trace_id = models.BigIntegerField(primary_key=True)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200, blank=True)
    adapter_version = models.CharField(max_length=200, blank=True)
    termination = models.CharField(max_length=32)
    received_at = models.DateTimeField()
    success = models.BooleanField(null=True)
    reward = models.FloatField(null=True)
    completion_tokens = models.IntegerField(null=True)
    tool_call_count = models.IntegerField(default=0)
    tool_results = models.JSONField(default=dict)
    tool_errors = models.JSONField(default=dict)
    tool_result_count = models.IntegerField(default=0)
    tool_error_count = models.IntegerField(default=0)
    answer_count = models.IntegerField(default=0)
    answer_words = models.IntegerField(default=0)
    truncated_replies = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"rolled-up trace {self.trace_id}"
