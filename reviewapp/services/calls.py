"""Gateway calls become traces: grouped by X-Trace-Id, or by a call extending earlier messages."""

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from django.conf import settings
from django.db import transaction

from reviewapp.gateway.conversation import common_prefix_length, conversation_hash, prefix_hashes
from reviewapp.ingest.chat import preview_text
from reviewapp.models import ModelCall, Termination, Trace, TraceSource
from reviewapp.services.ingest import search_text
from reviewapp.tasks import after_traces_changed


@dataclass
class RecordedCall:
    """One call as the gateway saw it; the recorder hands it to record_model_call off the
    request path."""

    project_id: int
    trace_id_header: str  # X-Trace-Id as sent, else traceparent's trace id; "" when neither
    requested_model: str
    upstream_model: str
    adapter_version: str
    upstream_url: str
    stream: bool
    request: dict  # the JSON body only: headers (and so credentials) are never kept
    response: dict | None
    status_code: int | None
    termination: str
    error: str
    started_at: datetime
    latency_ms: float
    time_to_first_token_ms: float | None


def _response_message(response: dict | None) -> dict | None:
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    kept = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def _request_messages(request: dict) -> list[dict] | None:
    messages = request.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        return messages
    return None


def _find_trace(*, call: RecordedCall, messages: list[dict]) -> Trace | None:
    traces = Trace.objects.select_for_update().filter(project_id=call.project_id)
    if call.trace_id_header:
        return traces.filter(external_id=call.trace_id_header).first()
    lengths = prefix_hashes(messages)
    if not lengths:
        return None
    since = call.started_at - timedelta(seconds=settings.GATEWAY_MERGE_WINDOW_SECONDS)
    candidates = list(
        traces.filter(
            source=TraceSource.GATEWAY,
            model=call.requested_model,
            tail_hash__in=list(lengths),
            updated_at__gte=since,
        )
    )
    # The longest conversation this call extends is the one it continues.
    return max(candidates, key=lambda trace: lengths[trace.tail_hash], default=None)


def _merge_tools(stored: list[dict], incoming: list) -> list[dict]:
    tools = {(t.get("function") or {}).get("name"): t for t in stored if isinstance(t, dict)}
    for tool in incoming if isinstance(incoming, list) else ():
        if isinstance(tool, dict):
            tools.setdefault((tool.get("function") or {}).get("name"), tool)
    return list(tools.values())


def _trace_termination(call: RecordedCall) -> str:
    return {
        "completed": Termination.COMPLETED,
        "truncated": Termination.TRUNCATED,
        "timeout": Termination.TIMEOUT,
        "client_disconnected": Termination.CLIENT_DISCONNECTED,
    }.get(call.termination, Termination.ERROR)


@transaction.atomic
def record_model_call(call: RecordedCall) -> ModelCall:
    """Store the call and fold it into its trace (created when it starts a conversation)."""
    messages = _request_messages(call.request)
    trace, turn_index = None, None
    if messages is not None:
        answer = _response_message(call.response)
        conversation = messages + ([answer] if answer else [])
        trace = _find_trace(call=call, messages=messages)
        if trace is None:
            trace = Trace(
                project_id=call.project_id,
                external_id=call.trace_id_header or f"gw-{uuid.uuid4().hex}",
                source=TraceSource.GATEWAY,
                started_at=call.started_at,
                body=b"",
            )
            stored_messages, stored_tools = [], []
        else:
            body = trace.body_json()
            stored_messages, stored_tools = body["messages"], body["tools"]
        shared = common_prefix_length(stored_messages, conversation)
        merged = stored_messages + conversation[shared:]
        if answer:
            turn_index = len(merged) - 1
        _update_trace(trace, call, merged, _merge_tools(stored_tools, call.request.get("tools")))
        after_traces_changed([trace.pk])
    usage = (call.response or {}).get("usage") if isinstance(call.response, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    choice = ((call.response or {}).get("choices") or [{}])[0] if call.response else {}
    choice = choice if isinstance(choice, dict) else {}
    return ModelCall.objects.create(
        project_id=call.project_id,
        trace=trace,
        turn_index=turn_index,
        requested_model=call.requested_model[:200],
        upstream_model=call.upstream_model[:200],
        adapter_version=call.adapter_version,
        upstream_url=call.upstream_url,
        stream=call.stream,
        request=ModelCall.pack(call.request),
        response=ModelCall.pack(call.response) if call.response is not None else None,
        status_code=call.status_code,
        termination=call.termination,
        error=call.error,
        finish_reason=str(choice.get("finish_reason") or "")[:32],
        started_at=call.started_at,
        latency_ms=call.latency_ms,
        time_to_first_token_ms=call.time_to_first_token_ms,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        has_token_ids=bool(choice.get("token_ids")),
        has_logprobs=bool(choice.get("logprobs")),
    )


def _update_trace(trace: Trace, call: RecordedCall, messages: list[dict], tools: list) -> None:
    usage = (call.response or {}).get("usage") if isinstance(call.response, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    body = Trace.pack_body(messages=messages, tools=tools)
    trace.body = body
    trace.content_hash = hashlib.sha256(orjson.dumps([messages, tools])).hexdigest()
    trace.tail_hash = conversation_hash(messages)
    trace.model = call.requested_model[:200]
    trace.adapter_version = call.adapter_version
    termination = _trace_termination(call)
    # A reply cut at max_tokens marks the episode: a later call that completes does not hide it.
    if not (termination == Termination.COMPLETED and trace.termination == Termination.TRUNCATED):
        trace.termination = termination
    trace.message_count = len(messages)
    trace.tool_call_count = sum(len(m.get("tool_calls") or ()) for m in messages)
    trace.preview = preview_text(messages)
    trace.search_text = search_text(messages)
    trace.prompt_tokens = (trace.prompt_tokens or 0) + (usage.get("prompt_tokens") or 0)
    trace.completion_tokens = (trace.completion_tokens or 0) + (usage.get("completion_tokens") or 0)
    trace.ended_at = call.started_at + timedelta(milliseconds=call.latency_ms)
    trace.updated_at = trace.ended_at
    trace.save()
