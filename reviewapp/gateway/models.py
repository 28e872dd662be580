"""What the gateway records of each call, and the calls it refused."""

import zlib

import orjson
from django.db import models

from reviewapp.projects.models import Project
from reviewapp.traces.models import Trace


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
