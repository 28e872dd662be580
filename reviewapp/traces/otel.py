"""OTLP/HTTP trace exports of OpenTelemetry GenAI spans -> Apprentice trace dicts.

Pure: takes the decoded request body (the `ExportTraceServiceRequest` JSON mapping; a protobuf
body is first turned into that mapping by `otlp_json_from_protobuf`) and returns plain dicts
shaped like the ingest API's Trace item. Every malformed field raises `OtlpError` naming its
path, so the caller can answer 400 without catching anything else.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from messages.text import TEXT_PART_KEYS, content_text

LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
# Older conventions put each message in a span event; the event name carries the role.
EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
ANY_VALUE_KINDS = (
    "stringValue",
    "boolValue",
    "intValue",
    "doubleValue",
    "arrayValue",
    "kvlistValue",
    "bytesValue",
)
# Deeper attribute values are abuse, not telemetry; the limit keeps recursion far from Python's.
MAX_VALUE_DEPTH = 32
# OTLP times are fixed64.
MAX_UNIX_NANO = 2**64 - 1
DIGITS = re.compile(r"-?\d{1,20}")
HEX_TRACE_ID = re.compile(r"[0-9a-fA-F]{32}")
INDEXED_FIELD = re.compile(r"(\d{1,9})\.(.+)")
# Our usage field -> the GenAI attributes that report it, current name first.
USAGE_KEYS = {
    "prompt_tokens": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
    "completion_tokens": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
}


class OtlpError(ValueError):
    """Not a usable OTLP JSON trace export; the message starts with the field path."""


@dataclass(frozen=True)
class _Event:
    name: str
    fields: dict[str, Any]  # attributes, plus the body's keys when an exporter sends one
    path: str


@dataclass(frozen=True)
class _Span:
    path: str
    trace_id: str
    name: str
    kind: str | None  # "llm", "tool", "agent", "genai" (other GenAI work) or None (not GenAI)
    start_ns: int | None
    end_ns: int | None
    attributes: dict[str, Any]
    events: tuple[_Event, ...]
    failed: bool
    status_message: str | None
    resource: dict[str, Any]

    def attribute_path(self, key: str) -> str:
        return f"{self.path}.attributes[{key}]"

    def str_attribute(self, key: str) -> str | None:
        return _optional_str(self.attributes.get(key), self.attribute_path(key))


def otlp_json_from_protobuf(body: bytes) -> dict:
    """A binary `ExportTraceServiceRequest` as the OTLP JSON mapping `traces_from_otlp` reads.

    The official OTLP rules for JSON: enums as integers, trace and span ids as hex (protobuf's
    own JSON mapping would write those bytes fields as base64).
    """
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as error:
        raise OtlpError(
            f"request body: not a protobuf ExportTraceServiceRequest ({error})"
        ) from None
    payload = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in payload.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _ids_to_hex(span)
                for link in span.get("links", ()):
                    _ids_to_hex(link)
    return payload


def _ids_to_hex(obj: dict) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def traces_from_otlp(payload: dict) -> list[dict]:
    """One ingest Trace dict per OTel trace id that holds GenAI messages, in request order."""
    spans_by_trace: dict[str, list[_Span]] = {}
    for span in _parse_request(payload):
        spans_by_trace.setdefault(span.trace_id, []).append(span)
    traces = []
    for trace_id, spans in spans_by_trace.items():
        trace = _build_trace(trace_id, sorted(spans, key=lambda span: span.start_ns or 0))
        if trace is not None:
            traces.append(trace)
    return traces


# --- Building a trace from its spans -------------------------------------------------------


def _build_trace(trace_id: str, spans: list[_Span]) -> dict | None:
    llm_spans = [span for span in spans if span.kind == "llm"]
    agent_spans = [span for span in spans if span.kind == "agent"]
    calls = [_call_messages(span) for span in llm_spans]
    if not any(inputs or outputs for inputs, outputs in calls):
        # Agent-only instrumentation records the conversation on the invoke_agent span.
        calls = [_call_messages(span) for span in agent_spans]
    # Agent spans may carry totals, but counting them beside their LLM calls would double them.
    measured_spans = llm_spans or agent_spans
    messages = _conversation(calls)
    if not messages:
        return None
    starts = [span.start_ns for span in spans if span.start_ns is not None]
    ends = [span.end_ns for span in spans if span.end_ns is not None]
    return {
        "external_id": trace_id,
        "messages": messages,
        "tools": _tool_definitions(spans),
        "model": _model(measured_spans),
        "metadata": {"otel": _otel_metadata(spans, messages)},
        "termination": _termination(spans, has_output=any(outputs for _, outputs in calls)),
        "started_at": _iso(min(starts)) if starts else None,
        "ended_at": _iso(max(ends)) if ends else None,
        "usage": _usage(measured_spans),
    }


def _conversation(calls: list[tuple[list[dict], list[dict]]]) -> list[dict]:
    """The last call's view of the conversation, keeping what delta-only frameworks left out."""
    conversation: list[dict] = []
    for inputs, outputs in calls:
        input_keys = [_message_key(message) for message in inputs]
        if input_keys[: len(conversation)] == [_message_key(m) for m in conversation]:
            # This call saw everything so far, so its input is the history (repeats included).
            conversation = inputs + outputs
            continue
        seen = {_message_key(message) for message in conversation}
        for message in inputs + outputs:
            key = _message_key(message)
            if key not in seen:
                conversation.append(message)
                seen.add(key)
    return conversation


def _message_key(message: dict) -> str:
    # Arguments are compared parsed: a framework often re-serialises the model's JSON
    # with different spacing when it sends the call back as history.
    tool_calls = [
        (call["id"], call["function"]["name"], _canonical_json(call["function"]["arguments"]))
        for call in message.get("tool_calls", [])
    ]
    fields = [message["role"], message["content"], tool_calls, message.get("tool_call_id")]
    return json.dumps(fields, sort_keys=True)


def _canonical_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except (ValueError, RecursionError):
        return text


def _termination(spans: list[_Span], *, has_output: bool) -> str:
    # A failure the agent moved past (a later LLM call succeeded) is not how the run ended.
    fatal = [span for span in spans if span.kind and span.failed and not _recovered(span, spans)]
    if any("timeout" in (span.str_attribute("error.type") or "").lower() for span in fatal):
        return "timeout"
    # A tool exception usually fails the agent span too; the tool is the more precise cause.
    if any(span.kind == "tool" for span in fatal):
        return "tool_error"
    if fatal:
        return "error"
    if any("length" in _finish_reasons(span) for span in spans if span.kind == "llm"):
        return "truncated"  # a reply was cut at max_tokens
    return "completed" if has_output else "unknown"


def _finish_reasons(span: _Span) -> list:
    reasons = span.attributes.get("gen_ai.response.finish_reasons")
    return [reasons] if isinstance(reasons, str) else reasons if isinstance(reasons, list) else []


def _recovered(failed: _Span, spans: list[_Span]) -> bool:
    if failed.end_ns is None:
        return False
    return any(
        span.kind == "llm"
        and not span.failed
        and span.start_ns is not None
        and span.start_ns >= failed.end_ns
        for span in spans
    )


def _model(call_spans: list[_Span]) -> str | None:
    # The response model names the exact snapshot that answered; the request model is an alias.
    for span in reversed(call_spans):
        for key in ("gen_ai.response.model", "gen_ai.request.model"):
            if model := span.str_attribute(key):
                return model
    return None


def _usage(call_spans: list[_Span]) -> dict[str, int] | None:
    totals = dict.fromkeys(USAGE_KEYS, 0)
    reported = False
    for span in call_spans:
        for total, keys in USAGE_KEYS.items():
            key = next((key for key in keys if span.attributes.get(key) is not None), None)
            if key is not None:
                totals[total] += _token_count(span.attributes[key], span.attribute_path(key))
                reported = True
    return totals if reported else None


def _token_count(value: Any, path: str) -> int:
    count = _int_value(value, path)
    if count < 0:
        raise OtlpError(f"{path}: expected a non-negative token count")
    return count


def _otel_metadata(spans: list[_Span], messages: list[dict]) -> dict:
    resource: dict[str, Any] = {}
    for span in spans:
        for key, value in span.resource.items():
            resource.setdefault(key, value)
    genai_spans = [span for span in spans if span.kind]
    otel = {
        "service.name": spans[0].resource.get("service.name"),
        "resource": resource,
        "span_count": len(spans),
        "conversation_id": _first_attribute(genai_spans, "gen_ai.conversation.id"),
        "agent_name": _first_attribute(genai_spans, "gen_ai.agent.name"),
        "tool_errors": _unseen_tool_errors(spans, messages),
    }
    # Omit what the exporter did not send; span_count is never 0.
    return {key: value for key, value in otel.items() if value}


def _first_attribute(spans: list[_Span], key: str) -> str | None:
    return next((value for span in spans if (value := span.str_attribute(key))), None)


def _unseen_tool_errors(spans: list[_Span], messages: list[dict]) -> list[dict]:
    """Failed tool runs whose result never reached the conversation, so a reviewer sees them."""
    answered = {message.get("tool_call_id") for message in messages if message["role"] == "tool"}
    errors = []
    for span in spans:
        if span.kind != "tool" or not span.failed:
            continue
        call_id = span.str_attribute("gen_ai.tool.call.id")
        if call_id is not None and call_id in answered:
            continue
        errors.append(
            {
                "tool": span.str_attribute("gen_ai.tool.name"),
                "call_id": call_id,
                "message": span.status_message or span.str_attribute("error.type"),
            }
        )
    return errors


def _tool_definitions(spans: list[_Span]) -> list[dict]:
    tools: dict[str, dict] = {}
    for span in spans:
        value = span.attributes.get("gen_ai.tool.definitions")
        if value is None:
            continue
        path = span.attribute_path("gen_ai.tool.definitions")
        for index, item in enumerate(_as_list(_json_value(value, path), path)):
            tool = _tool_definition(item, f"{path}[{index}]")
            tools.setdefault(tool["function"]["name"], tool)
    return list(tools.values())


def _tool_definition(item: Any, path: str) -> dict:
    item = _as_dict(item, path)
    # OpenAI nests the function under "function"; the flat form puts its keys beside "type".
    function = _as_dict(item["function"], f"{path}.function") if "function" in item else item
    name = _as_str(function.get("name"), f"{path}.name")
    definition: dict[str, Any] = {"name": name}
    description = _optional_str(function.get("description"), f"{path}.description")
    if description is not None:
        definition["description"] = description
    # Anthropic-shaped definitions call the JSON schema input_schema.
    parameters = function.get("parameters", function.get("input_schema"))
    if parameters is not None:
        definition["parameters"] = _json_object(parameters, f"{path}.parameters")
    return {"type": "function", "function": definition}


def _iso(unix_nano: int) -> str:
    instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=unix_nano // 1000)
    return instant.isoformat()


# --- One LLM call's messages, in any of the three conventions --------------------------------


def _call_messages(span: _Span) -> tuple[list[dict], list[dict]]:
    return _input_messages(span), _output_messages(span)


def _input_messages(span: _Span) -> list[dict]:
    if "gen_ai.input.messages" in span.attributes:
        messages = _attribute_messages(span, "gen_ai.input.messages", default_role="user")
    elif groups := _indexed(span.attributes, "gen_ai.prompt"):
        messages = _indexed_messages(span, "gen_ai.prompt", groups, default_role="user")
    else:
        messages = _event_messages(span)
    if "gen_ai.system_instructions" in span.attributes and not (
        messages and messages[0]["role"] == "system"
    ):
        messages = [*_system_instructions(span), *messages]
    return messages


def _event_messages(span: _Span) -> list[dict]:
    messages = []
    for event in span.events:
        if event.name in EVENT_ROLES:
            messages += _chat_message_from_fields(event.fields, EVENT_ROLES[event.name], event.path)
    return messages


def _output_messages(span: _Span) -> list[dict]:
    if "gen_ai.output.messages" in span.attributes:
        return _attribute_messages(span, "gen_ai.output.messages", default_role="assistant")
    if groups := _indexed(span.attributes, "gen_ai.completion"):
        return _indexed_messages(span, "gen_ai.completion", groups, default_role="assistant")
    messages = []
    for event in span.events:
        if event.name == "gen_ai.choice":
            path = f"{event.path}.message"
            fields = _json_object(event.fields.get("message", event.fields), path)
            messages += _chat_message_from_fields(fields, "assistant", path)
    return messages


def _attribute_messages(span: _Span, key: str, *, default_role: str) -> list[dict]:
    path = span.attribute_path(key)
    messages = []
    for index, raw in enumerate(_as_list(_json_value(span.attributes[key], path), path)):
        messages += _message(raw, default_role, f"{path}[{index}]")
    return messages


def _message(raw: Any, default_role: str, path: str) -> list[dict]:
    fields = _json_object(raw, path)
    if "parts" in fields:
        return _messages_from_parts(fields, default_role, path)
    # Pre-"parts" exporters put OpenAI-shaped messages in the same attribute.
    return _chat_message_from_fields(fields, default_role, path)


def _system_instructions(span: _Span) -> list[dict]:
    value = span.attributes["gen_ai.system_instructions"]
    path = span.attribute_path("gen_ai.system_instructions")
    if isinstance(value, str) and not value.lstrip().startswith(("[", "{")):
        # Some SDKs send the bare prompt rather than a list of parts.
        return [{"role": "system", "content": value}]
    parts = _as_list(_json_value(value, path), path)
    return _messages_from_parts({"role": "system", "parts": parts}, "system", path)


def _messages_from_parts(fields: dict, default_role: str, path: str) -> list[dict]:
    """One GenAI "parts" message -> OpenAI messages (tool results become their own messages)."""
    role = _optional_str(fields.get("role"), f"{path}.role") or default_role
    texts: list[str] = []
    tool_calls: list[dict] = []
    tool_results: list[dict] = []
    for index, part in enumerate(_as_list(fields.get("parts"), f"{path}.parts")):
        part_path = f"{path}.parts[{index}]"
        part = _as_dict(part, part_path)
        part_type = _optional_str(part.get("type"), f"{part_path}.type")
        if part_type == "text":
            texts.append(_as_str(part.get("content"), f"{part_path}.content"))
        elif part_type == "tool_call":
            tool_calls.append(_tool_call(part, part_path))
        elif part_type == "tool_call_response":
            call_id = _optional_str(part.get("id"), f"{part_path}.id")
            tool_results.append(_tool_message(call_id, part.get("response"), part_path))
        # Reasoning, media and future part types have no place in a text chat message.
    # OpenAI wants tool results right after the assistant turn that asked for them.
    if texts or tool_calls or not tool_results:
        return [*tool_results, _chat_message(role, "\n".join(texts), tool_calls)]
    return tool_results


def _chat_message_from_fields(fields: dict, default_role: str, path: str) -> list[dict]:
    """An OpenAI-shaped message (events, indexed attributes, older exporters) -> OpenAI messages."""
    role = _optional_str(fields.get("role"), f"{path}.role") or default_role
    if role == "tool":
        id_key = "tool_call_id" if "tool_call_id" in fields else "id"
        call_id = _optional_str(fields.get(id_key), f"{path}.{id_key}")
        return [_tool_message(call_id, fields.get("content"), f"{path}.content")]
    content = _content_text(fields.get("content"), f"{path}.content")
    calls_path = f"{path}.tool_calls"
    raw_calls = _as_list(_json_value(fields.get("tool_calls", []), calls_path), calls_path)
    tool_calls = [
        _tool_call(_as_dict(call, f"{calls_path}[{index}]"), f"{calls_path}[{index}]")
        for index, call in enumerate(raw_calls)
    ]
    return [_chat_message(role, content, tool_calls)]


def _chat_message(role: str, text: str, tool_calls: list[dict]) -> dict:
    # OpenAI's own shape: an assistant turn that only calls tools has null content.
    message: dict[str, Any] = {"role": role, "content": text if text or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _tool_call(fields: dict, path: str) -> dict:
    # OpenAI nests name/arguments under "function"; the GenAI parts form has them at the top.
    nested = "function" in fields
    function_path = f"{path}.function" if nested else path
    function = _as_dict(fields["function"], function_path) if nested else fields
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = _to_json({} if arguments is None else arguments, f"{function_path}.arguments")
    return {
        # Providers without call ids (Gemini) still get a string, as OpenAI requires one.
        "id": _optional_str(fields.get("id"), f"{path}.id") or "",
        "type": "function",
        "function": {
            "name": _as_str(function.get("name"), f"{function_path}.name"),
            "arguments": arguments,
        },
    }


def _tool_message(call_id: str | None, content: Any, path: str) -> dict:
    if content is None:
        content = ""
    elif not isinstance(content, str):
        content = _to_json(content, path)
    return {"role": "tool", "tool_call_id": call_id or "", "content": content}


def _content_text(value: Any, path: str) -> str:
    """Message content as text, by the rule everything else reads content with."""
    # Multimodal prompts are often recorded as a JSON string of OpenAI content parts;
    # anything that does not read as such is ordinary text that happens to look like JSON.
    if isinstance(value, str) and value.startswith("[{"):
        with contextlib.suppress(ValueError, RecursionError):
            parts = json.loads(value)
            if all(isinstance(part, dict) and isinstance(part.get("type"), str) for part in parts):
                value = parts
    if value is None or isinstance(value, str):
        return content_text(value)
    if not isinstance(value, list):
        raise OtlpError(f"{path}: expected a string or a list of content parts")
    return content_text(
        [_openai_part(part, f"{path}[{index}]") for index, part in enumerate(value)]
    )


def _openai_part(part: Any, path: str) -> str | dict:
    """A recorded content part in OpenAI's shape, its text checked to be a string."""
    if isinstance(part, str):
        return part
    part = _as_dict(part, path)
    part_type = _optional_str(part.get("type"), f"{path}.type")
    key = TEXT_PART_KEYS.get(part_type or "")
    if key is None:
        return part  # images, audio and files have no text form
    # GenAI-convention exporters keep a text part's text under "content".
    source_key = key if key in part else "content"
    return {"type": part_type, key: _as_str(part.get(source_key), f"{path}.{source_key}")}


def _indexed(attributes: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """Group `{prefix}.{i}.{field}` attributes by i, in index order: {i: {field: value}}."""
    groups: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if key.startswith(prefix + "."):
            match = INDEXED_FIELD.fullmatch(key[len(prefix) + 1 :])
            if match:
                groups.setdefault(int(match[1]), {})[match[2]] = value
    return dict(sorted(groups.items()))


def _indexed_messages(
    span: _Span, prefix: str, groups: dict[int, dict[str, Any]], *, default_role: str
) -> list[dict]:
    messages = []
    for index, fields in groups.items():
        if tool_calls := _indexed(fields, "tool_calls"):
            fields = {**fields, "tool_calls": list(tool_calls.values())}
        messages += _chat_message_from_fields(
            fields, default_role, span.attribute_path(f"{prefix}.{index}")
        )
    return messages


# --- Parsing the OTLP JSON envelope ------------------------------------------------------------


def _parse_request(payload: Any) -> list[_Span]:
    payload = _as_dict(payload, "request body")
    spans = []
    for resource_index, resource_spans in enumerate(_list_at(payload, "resourceSpans", "")):
        resource_path = f"resourceSpans[{resource_index}]"
        resource_spans = _as_dict(resource_spans, resource_path)
        resource = _dict_at(resource_spans, "resource", resource_path)
        resource_attributes = _attributes(resource, f"{resource_path}.resource")
        for scope_index, scope_spans in enumerate(
            _list_at(resource_spans, "scopeSpans", resource_path)
        ):
            scope_path = f"{resource_path}.scopeSpans[{scope_index}]"
            scope_spans = _as_dict(scope_spans, scope_path)
            for span_index, raw in enumerate(_list_at(scope_spans, "spans", scope_path)):
                span_path = f"{scope_path}.spans[{span_index}]"
                spans.append(_parse_span(raw, span_path, resource_attributes))
    return spans


def _parse_span(raw: Any, path: str, resource: dict[str, Any]) -> _Span:
    raw = _as_dict(raw, path)
    name = _optional_str(raw.get("name"), f"{path}.name") or ""
    attributes = _attributes(raw, path)
    events = tuple(
        _parse_event(event, f"{path}.events[{index}]")
        for index, event in enumerate(_list_at(raw, "events", path))
    )
    status = _dict_at(raw, "status", path)
    code = status.get("code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int | str)):
        raise OtlpError(f"{path}.status.code: expected a status code")
    return _Span(
        path=path,
        trace_id=_trace_id(raw.get("traceId"), f"{path}.traceId"),
        name=name,
        kind=_span_kind(name, attributes, events, path),
        start_ns=_unix_nano(raw.get("startTimeUnixNano"), f"{path}.startTimeUnixNano"),
        end_ns=_unix_nano(raw.get("endTimeUnixNano"), f"{path}.endTimeUnixNano"),
        attributes=attributes,
        events=events,
        # error.type is only set on failure, and some SDKs set it without the status.
        failed=code in (2, "STATUS_CODE_ERROR") or attributes.get("error.type") is not None,
        status_message=_optional_str(status.get("message"), f"{path}.status.message") or None,
        resource=resource,
    )


def _parse_event(raw: Any, path: str) -> _Event:
    raw = _as_dict(raw, path)
    fields = _attributes(raw, path)
    # OTLP span events have no body, but log-record-style exporters attach one; it wins.
    if raw.get("body") is not None:
        body = _any_value(raw["body"], f"{path}.body", depth=0)
        if isinstance(body, str) and not body.lstrip().startswith("{"):
            body = {"content": body}  # a bare string body is the message text
        fields.update(_json_object(body, f"{path}.body"))
    return _Event(
        name=_optional_str(raw.get("name"), f"{path}.name") or "", fields=fields, path=path
    )


def _span_kind(
    name: str, attributes: dict[str, Any], events: tuple[_Event, ...], path: str
) -> str | None:
    operation = _optional_str(
        attributes.get("gen_ai.operation.name"), f"{path}.attributes[gen_ai.operation.name]"
    )
    if operation in LLM_OPERATIONS:
        return "llm"
    if operation == "execute_tool":
        return "tool"
    if operation == "invoke_agent":
        return "agent"
    if operation is not None:
        return "genai"
    # Older instrumentations record messages without naming the operation.
    if name.startswith("chat ") or _carries_messages(attributes, events):
        return "llm"
    if any(key.startswith("gen_ai.") for key in attributes):
        return "genai"
    return None


def _carries_messages(attributes: dict[str, Any], events: tuple[_Event, ...]) -> bool:
    return (
        "gen_ai.input.messages" in attributes
        or "gen_ai.output.messages" in attributes
        or any(key.startswith(("gen_ai.prompt.", "gen_ai.completion.")) for key in attributes)
        or any(event.name in EVENT_ROLES or event.name == "gen_ai.choice" for event in events)
    )


def _trace_id(value: Any, path: str) -> str:
    """Lowercase hex; OTLP JSON says hex, but some exporters send protobuf-style base64."""
    text = _as_str(value, path)
    if HEX_TRACE_ID.fullmatch(text):
        trace_id = text.lower()
    else:
        try:
            raw = base64.b64decode(text, validate=True)
        except ValueError:
            raw = b""
        if len(raw) != 16:
            raise OtlpError(f"{path}: expected 32 hex characters (or base64 of 16 bytes)")
        trace_id = raw.hex()
    if trace_id == "0" * 32:
        raise OtlpError(f"{path}: the all-zero trace id is invalid")
    return trace_id


def _unix_nano(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and DIGITS.fullmatch(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OtlpError(f"{path}: expected nanoseconds since the Unix epoch")
    if not 0 <= value <= MAX_UNIX_NANO:
        raise OtlpError(f"{path}: out of range")
    return value or None  # proto3 JSON: 0 means unset


def _attributes(obj: dict, path: str) -> dict[str, Any]:
    return _key_values(_list_at(obj, "attributes", path), f"{path}.attributes", depth=0)


def _key_values(items: list, path: str, *, depth: int) -> dict[str, Any]:
    decoded = {}
    for index, item in enumerate(items):
        item_path = f"{path}[{index}]"
        item = _as_dict(item, item_path)
        key = _as_str(item.get("key"), f"{item_path}.key")
        decoded[key] = _any_value(item.get("value"), f"{item_path}.value", depth=depth)
    return decoded


def _any_value(value: Any, path: str, *, depth: int) -> Any:
    """Decode an OTLP AnyValue into plain JSON data."""
    if value is None:
        return None
    value = _as_dict(value, path)
    if depth > MAX_VALUE_DEPTH:
        raise OtlpError(f"{path}: nested too deeply")
    kinds = [kind for kind in ANY_VALUE_KINDS if kind in value]
    if not kinds:
        if value:
            raise OtlpError(f"{path}: unknown value type {next(iter(value))!r}")
        return None  # proto3 JSON writes an empty AnyValue as {}
    if len(kinds) > 1:
        raise OtlpError(f"{path}: expected one value type, got {', '.join(kinds)}")
    kind = kinds[0]
    raw, raw_path = value[kind], f"{path}.{kind}"
    if kind == "stringValue":
        return _as_str(raw, raw_path)
    if kind == "boolValue":
        if not isinstance(raw, bool):
            raise OtlpError(f"{raw_path}: expected true or false")
        return raw
    if kind == "intValue":
        return _int_value(raw, raw_path)
    if kind == "doubleValue":
        return _double_value(raw, raw_path)
    if kind == "bytesValue":
        return _bytes_value(raw, raw_path)
    items = _list_at(_as_dict(raw, raw_path), "values", raw_path)
    if kind == "arrayValue":
        return [
            _any_value(item, f"{raw_path}.values[{index}]", depth=depth + 1)
            for index, item in enumerate(items)
        ]
    return _key_values(items, f"{raw_path}.values", depth=depth + 1)


def _int_value(raw: Any, path: str) -> int:
    # int64 travels as a JSON string in proto3 JSON; some exporters send a number.
    if isinstance(raw, str) and DIGITS.fullmatch(raw):
        return int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    raise OtlpError(f"{path}: expected an integer")


def _double_value(raw: Any, path: str) -> float | str:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise OtlpError(f"{path}: expected a number")
    try:
        number = float(raw)
    except (ValueError, OverflowError):
        raise OtlpError(f"{path}: expected a number") from None
    if math.isfinite(number):
        return number
    # JSON (and Postgres jsonb) has no NaN or Infinity; keep the proto3 JSON spelling.
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def _bytes_value(raw: Any, path: str) -> str:
    # Kept as base64 text: the decoded bytes have no JSON form.
    text = _as_str(raw, path)
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        raise OtlpError(f"{path}: expected base64") from None
    return text


# --- Small typed accessors: every wrong shape becomes an OtlpError with its path --------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _as_dict(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise OtlpError(f"{path}: expected an object, got {_type_name(value)}")
    return value


def _as_list(value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise OtlpError(f"{path}: expected a list, got {_type_name(value)}")
    return value


def _as_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise OtlpError(f"{path}: expected a string, got {_type_name(value)}")
    return value


def _optional_str(value: Any, path: str) -> str | None:
    return None if value is None else _as_str(value, path)


def _list_at(obj: dict, key: str, path: str) -> list:
    # proto3 JSON omits empty repeated fields, so absent (or null) means empty.
    value = obj.get(key)
    return [] if value is None else _as_list(value, _join(path, key))


def _dict_at(obj: dict, key: str, path: str) -> dict:
    value = obj.get(key)
    return {} if value is None else _as_dict(value, _join(path, key))


def _json_value(value: Any, path: str) -> Any:
    """Attributes hold structured data either as a JSON string or as decoded AnyValues."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        raise OtlpError(f"{path}: not valid JSON") from None


def _json_object(value: Any, path: str) -> dict:
    return _as_dict(_json_value(value, path), path)


def _to_json(value: Any, path: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):
        raise OtlpError(f"{path}: cannot be encoded as JSON") from None


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
