"""Stored traces: their messages (compressed, in segments), how they ended, where they came from,
the tags they carry, and the hourly rollups every write keeps for the monitors."""

import zlib

import orjson
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

from reviewapp.projects.models import Project


class Termination(models.TextChoices):
    COMPLETED = "completed"
    TRUNCATED = "truncated"  # a reply was cut at max_tokens (finish_reason "length")
    TIMEOUT = "timeout"
    TOOL_ERROR = "tool_error"
    MAX_STEPS = "max_steps"
    ERROR = "error"
    CLIENT_DISCONNECTED = "client_disconnected"
    UNKNOWN = "unknown"


# An episode that ended like this is a failure whatever its reported success said.
FAILURE_TERMINATIONS = (
    Termination.TIMEOUT,
    Termination.TOOL_ERROR,
    Termination.MAX_STEPS,
    Termination.ERROR,
)


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
    # Facts the monitors aggregate (reviewapp/traces/facts.py), exact over every trace.
    tool_results = models.JSONField(default=dict, blank=True)  # tool name -> results
    tool_errors = models.JSONField(default=dict, blank=True)  # tool name -> error results
    tool_result_count = models.IntegerField(default=0)
    tool_error_count = models.IntegerField(default=0)
    answer_count = models.IntegerField(default=0)  # assistant turns with text, no tool call
    answer_words = models.IntegerField(default=0)  # words in those answers
    truncated_replies = models.IntegerField(default=0)  # replies cut at max_tokens
    answers_after_tool_error = models.IntegerField(default=0)  # answers right after a failed tool
    # zlib-compressed JSON {"messages": [...], "tools": [...]}; see `body_json`.
    body = models.BinaryField()
    # sha256 of the canonical item as received: tells an unchanged replay from a conflict.
    content_hash = models.CharField(max_length=64)
    # Gateway traces: hash of the conversation so far, so a call extending it joins this trace.
    tail_hash = models.CharField(max_length=64, blank=True)
    # Gateway traces: sha256 of the JSON of the last request whose messages are all the trace's
    # (see reviewapp.gateway.calls._fingerprint), so the next call finds it without hashing
    # its whole history canonically.
    sent_hash = models.CharField(max_length=64, blank=True)
    # The gateway recorder's bookkeeping, so a call appends without reading the body:
    # "segments": TraceSegment rows holding messages recorded since the body was last packed,
    # "tools": the trace's tool definitions (they live here while it is recorded),
    # "turns_without_tools": assistant turns whose call offered the model none (see tools_shown),
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
        """{"messages", "tools"}: the packed body plus what the gateway appended since, and
        "turns_without_tools" where the gateway recorded any (see `tools_shown`)."""
        body = (
            orjson.loads(zlib.decompress(bytes(self.body)))
            if self.body
            else {"messages": [], "tools": []}
        )
        recording = self.recording or {}
        if "tools" in recording:
            body["tools"] = recording["tools"]
        if recording.get("turns_without_tools"):
            body["turns_without_tools"] = recording["turns_without_tools"]
        if recording.get("segments"):
            for blob in self.segments.order_by("id").values_list("messages", flat=True):
                body["messages"].extend(orjson.loads(zlib.decompress(bytes(blob))))
        return body


def tools_shown(body: dict, turn: int) -> list[dict] | None:
    """The tool definitions the model's prompt held when it wrote message `turn` of a trace's
    body: the trace's, unless the gateway recorded that call offering none (no tools in the
    request, or tool_choice "none", which the model servers Apprentice starts render without
    them: vLLM's --exclude-tools-when-tool-choice-none). Training, the teacher and the gate
    render a turn with these, so they see the prompt that was served."""
    if turn in body.get("turns_without_tools", ()):
        return None
    return body["tools"] or None


class TraceSegment(models.Model):
    """Messages one gateway call added to its trace, stored once: a long episode costs each
    call its new messages, not the whole conversation again. When the episode goes quiet the
    segments are packed into the trace's body (reviewapp.gateway.calls.pack_trace_body)."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="segments")
    messages = models.BinaryField()  # zlib-compressed JSON list, in conversation order

    def __str__(self) -> str:
        return f"segment {self.pk} of {self.trace_id}"


class TraceOutcome(models.TextChoices):
    SUCCESS = "success"
    FAILURE = "failure"
    NONE = "none"  # no outcome reported


class SavedView(models.Model):
    """Trace-list filters a reviewer named: private to them, or shared with the project."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="saved_views")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    # The trace list's query string (its filter fields only), as the list's own links write it.
    query = models.CharField(max_length=2000, blank=True)
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # One view of a name per owner, whatever its case ("Timeouts" and "timeouts" would
            # sit side by side in the list, telling the reader nothing).
            models.UniqueConstraint(
                "project", "owner", Lower("name"), name="savedview_name_per_owner"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class TraceRollup(models.Model):
    """The monitors' counts and sums over a project's traces, per (model, adapter version, hour
    received, termination), kept up to date as traces are written (reviewapp/traces/rollups.py)
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
    answers_after_tool_error = models.BigIntegerField(default=0)

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
    answers_after_tool_error = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"rolled-up trace {self.trace_id}"


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
