"""Gateway calls become traces: grouped by X-Trace-Id, or by a call extending earlier messages.

Each message is stored once per trace. A call appends only the messages its trace does not have
yet (one `TraceSegment`), stores its request by reference (`ModelCall.request_prefix`), and the
trace's summary columns are updated from the new messages alone. Whether a call extends its
trace is told by the conversation hash of its messages up to the trace's length, one pass over
the request; only a call that rewrote earlier messages reads the stored body. When the episode
has been quiet for GATEWAY_QUIET_SECONDS, `settle_traces` packs the segments into the body and
triage and embedding run once.
"""

import hashlib
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import orjson
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import NOT_PROVIDED, signals
from django.db.models.base import ModelState
from django.utils import timezone

from reviewapp.gateway.conversation import (
    assistant_ends,
    common_prefix_length,
    conversation_hash,
    prefix_digests,
)
from reviewapp.gateway.models import ModelCall
from reviewapp.jobs import after_traces_changed, settle_when_quiet
from reviewapp.traces.chat import preview_text
from reviewapp.traces.facts import TraceFacts, add_message_facts
from reviewapp.traces.ingest import SEARCH_TEXT_MAX_CHARS, search_text
from reviewapp.traces.models import Termination, Trace, TraceSegment, TraceSource
from reviewapp.traces.rollups import roll_up_traces

# A settle task not heard of this long after it was due was lost (a broker restart): the next
# call schedules another.
SETTLE_GRACE_SECONDS = 600
# How far back a call's new tool results look for the assistant turn that called them.
LAST_TURN_SCAN = 64
# The requests' JSON a recording thread keeps in memory to check the next calls' histories
# against (_SentRequests).
SENT_REQUESTS_BYTES = 32 * 1024 * 1024


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


@dataclass
class _Batch:
    """Rows a batch writes at its end, one statement per table, and the traces it touched.

    A trace a call starts is inserted with the batch's other new traces (a later call in the
    batch may still extend it in memory), before anything that reads traces back by hash."""

    new_traces: dict[tuple[int, str], Trace] = field(default_factory=dict)  # by external id
    segments: list[TraceSegment] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)
    to_settle: dict[int, Trace] = field(default_factory=dict)  # by id(): new ones have no pk yet

    def pending_trace(self, project_id: int, external_id: str) -> Trace | None:
        """A trace started earlier in this batch and not inserted yet."""
        trace = self.new_traces.get((project_id, external_id))
        return trace if trace is not None and trace.pk is None else None

    def flush(self) -> None:
        """Insert the new traces, then the segments (they refer to the traces)."""
        insert_rows([trace for trace in self.new_traces.values() if trace.pk is None])
        insert_rows(self.segments)
        self.segments = []


def insert_rows(rows: list[models.Model]) -> None:
    """Insert new rows of one model in one statement and give them their ids.

    On PostgreSQL the rows go as one JSON document (orjson) that the server expands
    (`jsonb_populate_recordset`): the ORM's multi-row INSERT took more of the recorder's CPU
    than all the rest of its work (bench/README.md, gateway.py). Elsewhere (the embedded
    SQLite), `bulk_create`.
    """
    if not rows:
        return
    model = type(rows[0])
    if connection.vendor != "postgresql":
        model.objects.bulk_create(rows)
        return
    statement, fields = _insert_statement(model)
    for row in rows:
        for relation in fields.relations:  # a parent inserted since it was assigned
            parent = relation.get_cached_value(row, default=None)
            if parent is not None:
                setattr(row, relation.attname, parent.pk)
    document = orjson.dumps(
        [
            {
                column: _bytea_text(value) if column in fields.binary else value
                for column, value in zip(
                    fields.columns, map(row.__dict__.__getitem__, fields.attnames), strict=True
                )
            }
            for row in rows
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [document.decode()])
        for row, (pk,) in zip(rows, cursor.fetchall(), strict=True):
            row.pk = pk
            row._state.adding = False
            row._state.db = connection.alias


@dataclass(frozen=True)
class _InsertFields:
    attnames: list[str]
    columns: list[str]
    binary: frozenset[str]  # columns sent as bytea's hex text
    relations: list[models.ForeignKey]


_INSERT_STATEMENTS: dict[type, tuple[str, _InsertFields]] = {}


def _insert_statement(model: type[models.Model]) -> tuple[str, _InsertFields]:
    if model not in _INSERT_STATEMENTS:
        concrete = [field for field in model._meta.concrete_fields if not field.primary_key]
        fields = _InsertFields(
            attnames=[field.attname for field in concrete],
            columns=[field.column for field in concrete],
            binary=frozenset(
                field.column for field in concrete if isinstance(field, models.BinaryField)
            ),
            relations=[field for field in concrete if field.is_relation],
        )
        table = connection.ops.quote_name(model._meta.db_table)
        columns = ", ".join(map(connection.ops.quote_name, fields.columns))
        pk = connection.ops.quote_name(model._meta.pk.column)
        # In the document's order, so the ids come back in it (as with a multi-row VALUES).
        statement = (
            f"INSERT INTO {table} ({columns}) SELECT {columns}"
            f" FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb) WITH ORDINALITY"
            f" ORDER BY ordinality RETURNING {pk}"
        )
        _INSERT_STATEMENTS[model] = statement, fields
    return _INSERT_STATEMENTS[model]


@dataclass(frozen=True)
class _RowDefaults:
    """What Model.__init__ gives a model's fields when not passed: the same value every time
    (no default, or a default that is not callable: __init__ shares that one object too), or
    a callable's value per row (`dict`, `timezone.now`, a database default's expression)."""

    constant: dict[str, object]  # attname -> value, for attributes set in the row's __dict__
    per_row: list[tuple[str, Callable[[], object]]]  # attname -> field.get_default
    through_setattr: list[tuple[str, Callable[[], object]]]  # attributes with a setter


_ROW_DEFAULTS: dict[type, _RowDefaults] = {}


def _row_defaults(model: type[models.Model]) -> _RowDefaults:
    defaults = _ROW_DEFAULTS.get(model)
    if defaults is None:
        constant, per_row, through_setattr = {}, [], []
        for field in model._meta.fields:
            if field.column is None or field.generated:  # as __init__: nothing to set
                continue
            if hasattr(type(getattr(model, field.attname, None)), "__set__"):
                through_setattr.append((field.attname, field.get_default))
            elif field.db_default is NOT_PROVIDED and (
                not field.has_default() or not callable(field.default)
            ):
                constant[field.attname] = field.get_default()
            else:
                per_row.append((field.attname, field.get_default))
        defaults = _ROW_DEFAULTS[model] = _RowDefaults(constant, per_row, through_setattr)
    return defaults


def new_row(model: type[models.Model], **values) -> models.Model:
    """`model(**values)`, an unsaved row, without Model.__init__'s per-field work: each field
    gets its default as __init__ gives it, then `values` are set through the model's attributes
    (a relation through its descriptor, as __init__ sets one). A model with init signals is
    built by __init__. __init__ took ~10 us for a ModelCall and ~18 us for a Trace, the largest
    single part of the recorder's Python per call (bench/README.md, gateway.py)."""
    if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
        return model(**values)
    defaults = _row_defaults(model)
    row = model.__new__(model)
    row._state = ModelState()
    state = row.__dict__
    state.update(defaults.constant)
    for attname, default in defaults.per_row:
        state[attname] = default()
    for attname, default in defaults.through_setattr:
        setattr(row, attname, default())
    for name, value in values.items():
        setattr(row, name, value)
    return row


def _bytea_text(value: bytes | memoryview | None) -> str | None:
    return None if value is None else "\\x" + bytes(value).hex()


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
    # Parsed JSON: objects are exactly dict; the check runs in C (long histories).
    if isinstance(messages, list) and set(map(type, messages)) <= {dict}:
        return messages
    return None


def _find_trace(
    *, call: RecordedCall, messages: list[dict], conversation: list[dict], batch: _Batch
) -> tuple[Trace | None, dict[int, str], "_Fingerprint"]:
    """The trace the call continues (None: it starts one), the conversation's hashes at the
    lengths that matter (the trace's length and the whole), and the request's fingerprint.

    Without a trace id, the trace is the longest recent one this call's messages extend. The
    usual case is found from the fingerprint its last call left (`Trace.sent_hash`: the
    messages before this request's last assistant turn, as that call sent them); any other
    by the conversation hash of every prefix that ends in an assistant turn. A call with no
    assistant turn starts a trace without asking the database.
    """
    request_json = _MessagesJson(messages)
    if call.trace_id_header:
        trace = batch.pending_trace(call.project_id, call.trace_id_header)
        if trace is None:
            trace = _traces(call).filter(external_id=call.trace_id_header).first()
        return trace, *_extension_digests(trace, messages, conversation, request_json)
    raw = request_json()
    previous = _previous_request_hash(messages, raw)
    if previous is not None:
        batch.flush()  # a trace started earlier in the batch may be the one
        trace = _recent(call).filter(sent_hash=previous.hexdigest()).order_by("-updated_at")
        trace = trace.first()
        if trace is not None:
            digests, fingerprint = _extension_digests(
                trace, messages, conversation, request_json, previous
            )
            if digests.get(trace.message_count) == trace.tail_hash:
                return trace, digests, fingerprint
    ends = assistant_ends(messages)
    digests = prefix_digests(conversation, ends | {len(messages), len(conversation)})
    lengths = {digests[length]: length for length in ends}
    candidates = []
    if lengths:
        batch.flush()
        candidates = list(_recent(call).filter(tail_hash__in=list(lengths)))
    # The longest conversation this call extends is the one it continues.
    trace = max(candidates, key=lambda trace: lengths[trace.tail_hash], default=None)
    return trace, digests, _Fingerprint.of_json(messages, raw, digests)


def _traces(call: RecordedCall):
    """The project's traces, locked as read (the call may update the one it finds)."""
    return Trace.objects.select_for_update().defer("body").filter(project_id=call.project_id)


def _recent(call: RecordedCall):
    """The gateway traces of the call's model that a call without a trace id may continue."""
    since = call.started_at - timedelta(seconds=settings.GATEWAY_MERGE_WINDOW_SECONDS)
    return _traces(call).filter(
        source=TraceSource.GATEWAY, model=call.requested_model, updated_at__gte=since
    )


def _previous_request_hash(messages: list[dict], raw: memoryview):
    """The running sha256 of the JSON of the messages before the last assistant turn (without
    its closing "]"): the fingerprint of the call that got that turn, if the harness re-sends
    its history unchanged. Found in `raw` (the messages' JSON) by the length of what follows."""
    for index in range(len(messages) - 1, max(-1, len(messages) - 1 - LAST_TURN_SCAN), -1):
        if messages[index].get("role") == "assistant":
            # [a, b] + [c, d] is "[a,b" + "," + "c,d]": the first part's JSON minus its "]".
            after = len(orjson.dumps(messages[index:])) - 1
            return hashlib.sha256(raw[: len(raw) - after - 1 if index else 1])
    return None


class _MessagesJson:
    """The JSON of a request's messages (orjson), made the first time a check needs it: a
    history checked in memory (see _SentRequests) is not serialised at all."""

    def __init__(self, messages: list[dict]) -> None:
        self._messages = messages
        self._raw: memoryview | None = None

    def __call__(self) -> memoryview:
        if self._raw is None:
            self._raw = memoryview(orjson.dumps(self._messages))
        return self._raw


@dataclass(frozen=True)
class _Fingerprint:
    """What the next call checks its history against: the request's message count, the length
    of its messages' JSON, the sha256 of that JSON without its closing "]" (a running hash,
    so the next request's extends it with what it adds), and its conversation hash."""

    count: int
    size: int
    running: "hashlib._Hash"
    hash: str

    @classmethod
    def of_json(cls, messages: list[dict], raw: memoryview, digests: dict[int, str]):
        return cls(len(messages), len(raw), hashlib.sha256(raw[:-1]), digests[len(messages)])

    def stored(self) -> dict:
        """As the trace keeps it (`Trace.recording["sent"]`)."""
        return {"count": self.count, "bytes": self.size, "raw": self.running.hexdigest(),
                "hash": self.hash}  # fmt: skip


@dataclass(frozen=True)
class _Sent:
    messages: list[dict]  # the request's, as the recorder got them
    fingerprint: _Fingerprint
    stored: dict  # fingerprint.stored()


class _SentRequests(threading.local):
    """The last request this thread recorded for each recent trace, up to SENT_REQUESTS_BYTES
    of JSON, least recently used out first. A trace whose fingerprint is still that request's
    has the next call's history compared with it as objects (one pass in C, ~3x cheaper than
    serialising and hashing it), so a long episode's calls cost about the same to record as
    its first ones. A trace not here (another process recorded it, or it was evicted) is
    checked by its fingerprint. The recorder never changes a request it was handed."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple[int, str], _Sent] = OrderedDict()
        self.size = 0

    def get(self, key: tuple[int, str]) -> _Sent | None:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key: tuple[int, str], entry: _Sent) -> None:
        if (old := self.entries.pop(key, None)) is not None:
            self.size -= old.fingerprint.size
        if entry.fingerprint.size > SENT_REQUESTS_BYTES:
            return
        self.entries[key] = entry
        self.size += entry.fingerprint.size
        while self.size > SENT_REQUESTS_BYTES:
            _, dropped = self.entries.popitem(last=False)
            self.size -= dropped.fingerprint.size


_sent_requests = _SentRequests()


def _extension_digests(
    trace: Trace | None,
    messages: list[dict],
    conversation: list[dict],
    request_json: _MessagesJson,
    previous=None,
) -> tuple[dict[int, str], _Fingerprint]:
    """The conversation's hashes at the trace's length, the request's and its own, and the
    request's fingerprint for the next call. `previous`: a running sha256 of a prefix of the
    messages' JSON already computed (see _previous_request_hash).

    A harness re-sends its history unchanged: when the request starts with the previous
    request's messages (the trace's fingerprint), only the messages after them are
    canonicalised, hashed and serialised. Whether it does is told in memory when this thread
    recorded that request (_SentRequests), else by the sha256 of the request's JSON.
    """
    stored = trace.message_count if trace else 0
    lengths = {stored, len(messages), len(conversation)}
    sent = (trace.recording or {}).get("sent") if trace else None
    if sent and stored >= sent["count"]:
        running = _history_unchanged(trace, sent, messages, request_json, previous)
        if running is not None:
            digests = prefix_digests(
                conversation, lengths, start=sent["count"], start_hash=sent["hash"]
            )
            # [a, b] + [c, d] is "[a,b" + "," + "c,d]": the running hash goes on from "[a,b".
            added = orjson.dumps(messages[sent["count"] :])[1:-1]
            added = b"," + added if sent["count"] and added else added
            running.update(added)
            size = sent["bytes"] + len(added)
            return digests, _Fingerprint(len(messages), size, running, digests[len(messages)])
    digests = prefix_digests(conversation, lengths)
    return digests, _Fingerprint.of_json(messages, request_json(), digests)


def _history_unchanged(
    trace: Trace, sent: dict, messages: list[dict], request_json: _MessagesJson, previous
):
    """The running hash of the trace's last request (its JSON without the closing "]") when
    this request starts with that one's messages, else None."""
    count = sent["count"]
    if len(messages) < count:
        return None
    remembered = _sent_requests.get((trace.project_id, trace.external_id))
    if previous is None and remembered is not None and remembered.stored == sent:
        if messages[:count] == remembered.messages:
            return remembered.fingerprint.running.copy()
        return None
    raw = request_json()
    end = sent["bytes"] - 1
    if len(raw) < sent["bytes"] or raw[end] not in b",]":
        return None
    running = previous.copy() if previous else hashlib.sha256(raw[:end])
    return running if running.hexdigest() == sent["raw"] else None


def _offers_tools(request: dict) -> bool:
    """Whether the call's prompt showed the model tool definitions (Trace.tools_shown)."""
    return bool(request.get("tools")) and request.get("tool_choice") != "none"


def _merge_tools(stored: list[dict], incoming: list) -> list[dict]:
    tools = {(t.get("function") or {}).get("name"): t for t in stored if isinstance(t, dict)}
    for tool in incoming if isinstance(incoming, list) else ():
        if isinstance(tool, dict):
            tools.setdefault((tool.get("function") or {}).get("name"), tool)
    return list(tools.values())


# A call that ended like this ends its trace the same way; any other failure is an error.
_CALL_ENDS_TRACE_ALIKE = frozenset(
    {
        Termination.COMPLETED,
        Termination.TRUNCATED,
        Termination.TIMEOUT,
        Termination.CLIENT_DISCONNECTED,
    }
)


def _trace_termination(call: RecordedCall) -> str:
    if call.termination in _CALL_ENDS_TRACE_ALIKE:
        return Termination(call.termination)
    return Termination.ERROR


def _search_parts(messages: list[dict]) -> tuple[list[str], list[str]]:
    """The tool errors and the answers of `search_text`, one part per message."""
    errors, answers = [], []
    for message in messages:
        part = search_text([message])
        if part:
            (errors if message.get("role") == "tool" else answers).append(part)
    return errors, answers


def _extend_search_text(text: str, error_chars: int, added: list[dict]) -> tuple[str, int]:
    """`search_text` of the whole conversation from the stored one and the new messages: the
    tool errors lead (the first `error_chars` characters), then the answers, cut at the limit.
    A part cut off stays cut off, as it would be if the whole were computed again."""
    errors, answers = _search_parts(added)
    if not errors and not answers:
        return text, error_chars
    stored_errors = text[:error_chars]
    stored_answers = text[error_chars + 1 :] if error_chars else text
    error_part = "\n".join(part for part in [stored_errors, *errors] if part)
    answer_part = "\n".join(part for part in [stored_answers, *answers] if part)
    joined = "\n".join(part for part in (error_part, answer_part) if part)
    return joined[:SEARCH_TEXT_MAX_CHARS], min(len(error_part), SEARCH_TEXT_MAX_CHARS)


def _adopt(trace: Trace) -> dict:
    """The recorder's bookkeeping for a trace it did not record (pushed, or stored before the
    bookkeeping existed), read once from its body."""
    body = trace.body_json()
    errors, _ = _search_parts(body["messages"])
    return {
        "tools": body["tools"],
        "error_chars": min(len("\n".join(errors)), SEARCH_TEXT_MAX_CHARS),
    }


def _call_row(call: RecordedCall) -> ModelCall:
    usage = (call.response or {}).get("usage") if isinstance(call.response, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    choice = ((call.response or {}).get("choices") or [{}])[0] if call.response else {}
    choice = choice if isinstance(choice, dict) else {}
    return new_row(
        ModelCall,
        project_id=call.project_id,
        requested_model=call.requested_model[:200],
        upstream_model=call.upstream_model[:200],
        adapter_version=call.adapter_version,
        upstream_url=call.upstream_url,
        stream=call.stream,
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


def record_model_calls(
    calls: list[RecordedCall], *, ask_settle: Callable[[list[int]], None] = settle_when_quiet
) -> list[ModelCall]:
    """Store calls in order, in one transaction, each folded into its trace (created when it
    starts a conversation); the traces settle once they go quiet. Once the transaction
    commits, `ask_settle` gets the traces that need a settle task (the recorder collects them
    to publish one task for many batches)."""
    batch = _Batch()
    with transaction.atomic():
        for call in calls:
            _record(call, batch)
        batch.flush()
        insert_rows(batch.calls)
        roll_up_traces(trace_ids={row.trace_id for row in batch.calls if row.trace_id})
        to_settle = sorted({trace.pk for trace in batch.to_settle.values()})
        if to_settle:
            transaction.on_commit(lambda: ask_settle(to_settle))
    return batch.calls


def record_model_call(call: RecordedCall) -> ModelCall:
    """Store one call (see record_model_calls)."""
    return record_model_calls([call])[0]


def _record(call: RecordedCall, batch: _Batch) -> None:
    row = _call_row(call)
    batch.calls.append(row)
    messages = _request_messages(call.request)
    if messages is None:
        row.request = ModelCall.pack(call.request)
        return
    answer = _response_message(call.response)
    conversation = messages + ([answer] if answer else [])
    trace, digests, fingerprint = _find_trace(
        call=call, messages=messages, conversation=conversation, batch=batch
    )
    starts = trace is None
    if starts:
        trace = new_row(
            Trace,
            project_id=call.project_id,
            external_id=call.trace_id_header or f"gw-{uuid.uuid4().hex}",
            source=TraceSource.GATEWAY,
            started_at=call.started_at,
            body=b"",
            recording={"tools": [], "error_chars": 0},
        )
        batch.new_traces[(call.project_id, trace.external_id)] = trace  # inserted at flush
    recording = dict(trace.recording or {})
    if trace.pk is not None and "tools" not in recording:
        batch.flush()
        recording = _adopt(trace)
    stored_count = trace.message_count
    if starts or digests.get(stored_count) == trace.tail_hash:
        shared = stored_count  # the call extends the trace: its first messages are the trace
        tail_hash = digests[len(conversation)]
    else:  # it rewrote earlier messages, or the trace was pushed, not recorded: read the body
        batch.flush()
        stored = trace.body_json()["messages"]
        shared = common_prefix_length(stored, conversation)
        tail_hash = conversation_hash(stored + conversation[shared:])
    added = conversation[shared:]

    tools = _merge_tools(recording["tools"], call.request.get("tools"))
    recording["tools"] = tools
    incoming_tools = call.request.get("tools")
    if isinstance(incoming_tools, list) and incoming_tools == tools[: len(incoming_tools)]:
        row.request_tools_prefix = len(incoming_tools)
    row.request_prefix = len(messages) if shared == stored_count else shared
    if row.request_prefix == len(messages):  # every message it sent is the trace's, in place
        recording["sent"] = fingerprint.stored()
        trace.sent_hash = recording["sent"]["raw"]
        _sent_requests.put(
            (trace.project_id, trace.external_id),
            _Sent(messages, fingerprint, recording["sent"]),
        )
    residual = {key: value for key, value in call.request.items() if key != "messages"}
    if row.request_tools_prefix is not None:
        del residual["tools"]
    residual["messages"] = messages[row.request_prefix :]
    row.request = ModelCall.pack(residual)
    row.turn_index = stored_count + len(added) - 1 if answer else None
    if answer and tools and not _offers_tools(call.request):
        hidden = recording.get("turns_without_tools", [])
        recording["turns_without_tools"] = [*hidden, row.turn_index]

    if added:
        recording["segments"] = recording.get("segments", 0) + 1
    before = (trace.search_text, trace.preview)
    trace.search_text, recording["error_chars"] = _extend_search_text(
        trace.search_text, recording.get("error_chars", 0), added
    )
    _update_trace(trace, call, added, tail_hash)
    facts = add_message_facts(
        TraceFacts.of_trace(trace),
        added,
        earlier_messages=_last_turn(conversation, shared),
        truncated_replies=int(bool(answer) and call.termination == "truncated"),
    )
    for name, value in facts.columns().items():
        setattr(trace, name, value)
    if _settle_due_now(recording):
        batch.to_settle[id(trace)] = trace
    trace.recording = recording
    if trace.pk is not None:  # a trace not inserted yet is inserted as it is at the flush
        # Unchanged long text is not sent: PostgreSQL would store (TOAST) it again.
        unchanged = (
            {"search_text", "preview"} if before == (trace.search_text, trace.preview) else set()
        )
        trace.save(update_fields=[name for name in _UPDATED_FIELDS if name not in unchanged])
    if added:
        batch.segments.append(new_row(TraceSegment, trace=trace, messages=_pack_messages(added)))
    row.trace = trace


_UPDATED_FIELDS = [
    "model",
    "adapter_version",
    "termination",
    "message_count",
    "tool_call_count",
    "preview",
    "search_text",
    "content_hash",
    "tail_hash",
    "sent_hash",
    "prompt_tokens",
    "completion_tokens",
    "ended_at",
    "updated_at",
    "recording",
    *TraceFacts().columns(),
]


def _last_turn(conversation: list[dict], end: int) -> list[dict]:
    """The messages from the last assistant turn before `end`: the tool calls that the tool
    results after it answer."""
    start = end - 1
    while start > max(0, end - LAST_TURN_SCAN) and conversation[start].get("role") != "assistant":
        start -= 1
    return conversation[max(start, 0) : end]


def _pack_messages(messages: list[dict]) -> bytes:
    return zlib.compress(orjson.dumps(messages), 1)


def _update_trace(trace: Trace, call: RecordedCall, added: list[dict], tail_hash: str) -> None:
    """The summary columns of the trace plus `added`, without reading what it had."""
    usage = (call.response or {}).get("usage") if isinstance(call.response, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    # The conversation hash stands for the content: a pushed trace's hash never equals it.
    trace.content_hash = tail_hash
    trace.tail_hash = tail_hash
    trace.model = call.requested_model[:200]
    trace.adapter_version = call.adapter_version
    termination = _trace_termination(call)
    # A reply cut at max_tokens marks the episode: a later call that completes does not hide it.
    if not (termination == Termination.COMPLETED and trace.termination == Termination.TRUNCATED):
        trace.termination = termination
    trace.message_count += len(added)
    trace.tool_call_count += sum(len(m.get("tool_calls") or ()) for m in added)
    if not trace.preview:
        trace.preview = preview_text(added)
    trace.prompt_tokens = (trace.prompt_tokens or 0) + (usage.get("prompt_tokens") or 0)
    trace.completion_tokens = (trace.completion_tokens or 0) + (usage.get("completion_tokens") or 0)
    trace.ended_at = call.started_at + timedelta(milliseconds=call.latency_ms)
    trace.updated_at = trace.ended_at


def _settle_due_now(recording: dict) -> bool:
    """Whether this call schedules the trace's settle task: one per quiet period, none while
    one is pending (unless it is long overdue: lost with a broker restart)."""
    due = recording.get("settle_due")
    now = time.time()
    if due is not None and now <= due + SETTLE_GRACE_SECONDS:
        return False
    recording["settle_due"] = now + settings.GATEWAY_QUIET_SECONDS
    return True


def settle_traces(*, trace_ids: list[int], force: bool = False) -> dict[int, float]:
    """Settle the traces that have been quiet for GATEWAY_QUIET_SECONDS: pack what the gateway
    appended into each one's body (a transaction per trace), then triage and embed them
    together. Returns the seconds each of the others must still be quiet. `force`: settle now
    (no worker to wait with)."""
    waits, settled = {}, []
    for trace_id in trace_ids:
        wait = _settle(trace_id=trace_id, force=force)
        if wait is None:
            continue
        if wait > 0:
            waits[trace_id] = wait
        else:
            settled.append(trace_id)
    after_traces_changed(settled)
    return waits


@transaction.atomic
def _settle(*, trace_id: int, force: bool) -> float | None:
    """Seconds the trace must still be quiet (0: it settled now); None: it is gone."""
    trace = Trace.objects.select_for_update().filter(pk=trace_id).first()
    if trace is None:
        return None
    quiet_for = (timezone.now() - trace.updated_at).total_seconds()
    wait = settings.GATEWAY_QUIET_SECONDS - quiet_for
    recording = dict(trace.recording or {})
    if wait > 0 and not force:
        recording["settle_due"] = time.time() + wait
        trace.recording = recording
        trace.save(update_fields=["recording"])
        return wait
    recording.pop("settle_due", None)
    if recording.get("segments"):
        body = trace.body_json()
        trace.body = Trace.pack_body(messages=body["messages"], tools=body["tools"])
        trace.segments.all().delete()
        recording["segments"] = 0
    trace.recording = recording
    trace.save(update_fields=["body", "recording"])
    return 0.0
