"""Storing traces: validated per item, idempotent on (project, external_id), few queries a batch."""

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.db.models import JSONField
from psycopg import sql
from psycopg.types.json import Jsonb

from messages.text import message_text
from reviewapp.jobs import after_traces_changed
from reviewapp.projects.models import Project
from reviewapp.traces.chat import (
    IngestError,
    TraceItem,
    parse_trace_item,
    preview_text,
    unknown_fields,
)
from reviewapp.traces.facts import facts_of
from reviewapp.traces.models import Tag, Termination, Trace, TraceSource, TraceTag
from reviewapp.traces.rendering import looks_like_tool_error
from reviewapp.traces.rollups import roll_up_traces

# Enough for the answers of a long episode; the trigram index stays small per row.
SEARCH_TEXT_MAX_CHARS = 8000


@dataclass
class ItemResult:
    external_id: str | None
    status: int  # 201 created, 200 unchanged duplicate, 4xx rejected
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        result: dict[str, Any] = {"external_id": self.external_id, "status": self.status}
        if self.error:
            result["error"] = self.error
        if self.warnings:
            result["warnings"] = self.warnings
        return result


@dataclass
class _Accepted:
    position: int
    item: TraceItem
    raw: dict  # stored as received: a GET returns exactly what was sent
    content_hash: str


def search_text(messages: list[dict]) -> str:
    """What the text filter searches beyond the id and first user message: tool errors (short,
    and what a reviewer hunts for) first, then assistant answers and their tool calls."""
    errors, answers = [], []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            text = message_text(message)
            if looks_like_tool_error(text):
                errors.append(text[:1000])
        elif role == "assistant":
            answers.append(message_text(message))
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    answers.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return "\n".join(part for part in errors + answers if part)[:SEARCH_TEXT_MAX_CHARS]


def content_hash_of(raw: dict) -> str:
    known = {key: value for key, value in raw.items() if key in TraceItem.model_fields}
    return hashlib.sha256(orjson.dumps(known, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _raw_external_id(raw: Any) -> str | None:
    external_id = raw.get("external_id") if isinstance(raw, dict) else None
    return external_id if isinstance(external_id, str) else None


def _trace_values(*, project: Project, entry: _Accepted, source: str) -> dict[str, Any]:
    """The new trace's column values by attribute name; the rest take the model's defaults."""
    item = entry.item
    messages = entry.raw["messages"]
    tools = entry.raw.get("tools") or []
    outcome = item.outcome or None
    usage = item.usage or None
    return dict(
        project_id=project.pk,
        external_id=item.external_id,
        source=source,
        model=item.model or "",
        termination=item.termination,
        reward=outcome.reward if outcome else None,
        success=outcome.success if outcome else None,
        metadata=item.metadata,
        started_at=item.started_at,
        ended_at=item.ended_at,
        prompt_tokens=usage.prompt_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
        message_count=len(messages),
        tool_call_count=sum(len(message.get("tool_calls", ())) for message in messages),
        preview=preview_text(messages),
        search_text=search_text(messages),
        **facts_of(messages, truncated=item.termination == Termination.TRUNCATED).columns(),
        body=Trace.pack_body(messages=messages, tools=tools),
        content_hash=entry.content_hash,
    )


def ingest_traces(
    *,
    project: Project,
    raw_items: list[Any],
    source: str = TraceSource.API,
    create_tags: bool = True,
) -> list[ItemResult]:
    """Validate and store a batch; one result per item, in order. Good items land beside bad.

    `create_tags=False`: a trace's tags apply only where the taxonomy has them; the others are
    named in its result's warnings.
    """
    results: list[ItemResult | None] = [None] * len(raw_items)
    accepted: dict[str, _Accepted] = {}
    for position, raw in enumerate(raw_items):
        try:
            item = parse_trace_item(
                raw,
                max_depth=settings.INGEST_MAX_NESTING_DEPTH,
                max_messages=settings.INGEST_MAX_MESSAGES_PER_TRACE,
            )
        except IngestError as error:
            results[position] = ItemResult(_raw_external_id(raw), 422, str(error))
            continue
        warnings = [f"unknown field {name!r} ignored" for name in unknown_fields(raw)]
        content_hash = content_hash_of(raw)
        earlier = accepted.get(item.external_id)
        if earlier is not None:  # the same id twice in one batch
            same = earlier.content_hash == content_hash
            results[position] = _duplicate_result(item.external_id, same, warnings)
            continue
        accepted[item.external_id] = _Accepted(position, item, raw, content_hash)
        results[position] = ItemResult(item.external_id, 201, warnings=warnings)

    if accepted and not create_tags:
        _warn_unknown_tags(project=project, accepted=accepted, results=results)
    if accepted:
        _store(
            project=project,
            accepted=accepted,
            results=results,
            source=source,
            create_tags=create_tags,
        )
    return [result for result in results if result is not None]


def _warn_unknown_tags(
    *, project: Project, accepted: dict[str, _Accepted], results: list[ItemResult | None]
) -> None:
    names = {name for entry in accepted.values() for name in entry.item.tags}
    known = set(Tag.objects.filter(project=project, name__in=names).values_list("name", flat=True))
    for entry in accepted.values():
        for name in entry.item.tags:
            if name not in known:
                results[entry.position].warnings.append(
                    f"tag {name!r} is not in the project's taxonomy and was not applied "
                    "(only a key with the review scope adds tags)"
                )


def _duplicate_result(external_id: str, same_content: bool, warnings: list[str]) -> ItemResult:
    if same_content:
        return ItemResult(external_id, 200, warnings=warnings)
    return ItemResult(
        external_id,
        409,
        "external_id is already stored with different content; the stored trace is unchanged",
        warnings,
    )


@transaction.atomic
def _store(
    *,
    project: Project,
    accepted: dict[str, _Accepted],
    results: list[ItemResult | None],
    source: str,
    create_tags: bool,
) -> None:
    if connection.vendor == "postgresql":
        new_ids, stored = _insert_by_copy(project=project, accepted=accepted, source=source)
    else:
        new_ids, stored = _insert_by_orm(project=project, accepted=accepted, source=source)
    for external_id, (content_hash, stored_source) in stored.items():
        entry = accepted[external_id]
        previous = results[entry.position]
        if source == TraceSource.OTEL and stored_source == TraceSource.GATEWAY:
            # The harness's spans describe calls the gateway recorded in full (traceparent):
            # one trace per episode, and the gateway's record is the faithful one.
            previous.status = 200
            previous.warnings.append("recorded by the gateway under this trace id; kept as it is")
            continue
        results[entry.position] = _duplicate_result(
            external_id, content_hash == entry.content_hash, previous.warnings
        )
    if not new_ids:
        return
    roll_up_traces(trace_ids=new_ids.values())
    tagged = [accepted[external_id] for external_id in new_ids if accepted[external_id].item.tags]
    if tagged:
        _tag_new_traces(project=project, tagged=tagged, trace_ids=new_ids, create_tags=create_tags)
    after_traces_changed(list(new_ids.values()))


# The staging table's column types, by its columns: binary COPY sends values as these types.
_STAGE_TYPES: dict[tuple[str, ...], list[int]] = {}


def _stage_types(cursor, columns: tuple[str, ...]) -> list[int]:
    if columns not in _STAGE_TYPES:
        cursor.execute(
            "SELECT atttypid FROM pg_attribute WHERE attrelid = 'trace_stage'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
        _STAGE_TYPES[columns] = [oid for (oid,) in cursor.fetchall()]
    return _STAGE_TYPES[columns]


def _copy_rows(*, project: Project, accepted: dict[str, _Accepted], source: str, fields: list):
    """Each trace's values in `fields` order, as binary COPY takes them."""
    defaults = {field.attname: field.get_default() for field in fields}
    json_fields = {field.attname for field in fields if isinstance(field, JSONField)}
    for entry in accepted.values():
        values = {**defaults, **_trace_values(project=project, entry=entry, source=source)}
        yield [
            Jsonb(values[name], dumps=orjson.dumps) if name in json_fields else values[name]
            for name in (field.attname for field in fields)
        ]


def _insert_by_copy(
    *, project: Project, accepted: dict[str, _Accepted], source: str
) -> tuple[dict[str, int], dict[str, tuple[str, str]]]:
    """COPY the batch into a staging table, then one INSERT ... SELECT ... ON CONFLICT.

    Returns (external_id -> id of each trace inserted now, external_id -> (content_hash,
    source) of each that was already stored). The unique constraint decides: a concurrent
    batch storing the same id first makes ours a duplicate, never a failure.
    """
    fields = [field for field in Trace._meta.concrete_fields if not field.primary_key]
    columns = sql.SQL(", ").join(sql.Identifier(field.column) for field in fields)
    stage = sql.Identifier("trace_stage")
    with connection.cursor() as cursor:
        cursor.execute(
            sql.SQL(
                "CREATE TEMPORARY TABLE {stage} ON COMMIT DROP AS "
                "SELECT {columns} FROM reviewapp_trace WITH NO DATA"
            ).format(stage=stage, columns=columns)
        )
        types = _stage_types(cursor, tuple(field.column for field in fields))
        with cursor.copy(
            sql.SQL("COPY {stage} ({columns}) FROM STDIN (FORMAT BINARY)").format(
                stage=stage, columns=columns
            )
        ) as copy:
            copy.set_types(types)
            for row in _copy_rows(project=project, accepted=accepted, source=source, fields=fields):
                copy.write_row(row)
        # The outer SELECT reads the snapshot from before the INSERT: it sees what was stored
        # before this batch, which is what a duplicate is compared with.
        cursor.execute(
            sql.SQL(
                "WITH inserted AS ("
                " INSERT INTO reviewapp_trace ({columns}) SELECT {columns} FROM {stage}"
                " ON CONFLICT (project_id, external_id) DO NOTHING"
                " RETURNING id, external_id)"
                " SELECT staged.external_id, inserted.id, stored.content_hash, stored.source"
                " FROM {stage} AS staged"
                " LEFT JOIN inserted ON inserted.external_id = staged.external_id"
                " LEFT JOIN reviewapp_trace AS stored"
                "  ON stored.project_id = %s AND stored.external_id = staged.external_id"
            ).format(stage=stage, columns=columns),
            [project.pk],
        )
        staged = cursor.fetchall()
        # Dropped now, not at commit: an outer transaction may store another batch first.
        cursor.execute(sql.SQL("DROP TABLE {stage}").format(stage=stage))
    new_ids, stored, raced = {}, {}, []
    for external_id, trace_id, content_hash, stored_source in staged:
        if trace_id is not None:
            new_ids[external_id] = trace_id
        elif content_hash is not None:
            stored[external_id] = (content_hash, stored_source)
        else:  # stored by a concurrent batch after this statement's snapshot was taken
            raced.append(external_id)
    if raced:
        stored.update(_stored_hashes(project=project, external_ids=raced))
    return new_ids, stored


def _stored_hashes(*, project: Project, external_ids: list[str]) -> dict[str, tuple[str, str]]:
    return {
        external_id: (content_hash, stored_source)
        for external_id, content_hash, stored_source in Trace.objects.filter(
            project=project, external_id__in=external_ids
        ).values_list("external_id", "content_hash", "source")
    }


def _insert_by_orm(
    *, project: Project, accepted: dict[str, _Accepted], source: str
) -> tuple[dict[str, int], dict[str, tuple[str, str]]]:
    """The same as `_insert_by_copy` for databases without COPY (the embedded SQLite)."""
    stored = _stored_hashes(project=project, external_ids=list(accepted))
    new = [entry for external_id, entry in accepted.items() if external_id not in stored]
    # A concurrent batch may insert the same id between our read and write: the unique
    # constraint keeps one row and ignore_conflicts keeps this batch from failing.
    Trace.objects.bulk_create(
        [Trace(**_trace_values(project=project, entry=entry, source=source)) for entry in new],
        ignore_conflicts=True,
        batch_size=500,
    )
    new_ids = dict(
        Trace.objects.filter(
            project=project, external_id__in=[entry.item.external_id for entry in new]
        ).values_list("external_id", "id")
    )
    return new_ids, stored


def _tag_new_traces(
    *, project: Project, tagged: list[_Accepted], trace_ids: dict[str, int], create_tags: bool
) -> None:
    names = {name for entry in tagged for name in entry.item.tags}
    if create_tags:
        Tag.objects.bulk_create(
            [Tag(project=project, name=name) for name in names], ignore_conflicts=True
        )
    tag_ids = dict(Tag.objects.filter(project=project, name__in=names).values_list("name", "id"))
    TraceTag.objects.bulk_create(
        [
            TraceTag(trace_id=trace_ids[entry.item.external_id], tag_id=tag_ids[name])
            for entry in tagged
            for name in entry.item.tags
            if name in tag_ids
        ],
        ignore_conflicts=True,
    )
