"""Storing traces: validated per item, idempotent on (project, external_id), few queries a batch."""

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction

from reviewapp.ingest.chat import (
    IngestError,
    TraceItem,
    parse_trace_item,
    preview_text,
    unknown_fields,
)
from reviewapp.models import Project, Tag, Termination, Trace, TraceSource, TraceTag
from reviewapp.rendering import looks_like_tool_error
from reviewapp.services.facts import facts_of
from reviewapp.tasks import after_traces_changed
from training.text import message_text

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


def _trace_row(*, project: Project, entry: _Accepted, source: str) -> Trace:
    item = entry.item
    messages = entry.raw["messages"]
    tools = entry.raw.get("tools") or []
    outcome = item.outcome or None
    usage = item.usage or None
    return Trace(
        project=project,
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
    stored = {
        external_id: (content_hash, stored_source)
        for external_id, content_hash, stored_source in Trace.objects.filter(
            project=project, external_id__in=list(accepted)
        ).values_list("external_id", "content_hash", "source")
    }
    new = []
    for external_id, entry in accepted.items():
        if external_id not in stored:
            new.append(entry)
            continue
        content_hash, stored_source = stored[external_id]
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
    if not new:
        return
    # A concurrent batch may insert the same id between our read and write: the unique
    # constraint keeps one row and ignore_conflicts keeps this batch from failing.
    Trace.objects.bulk_create(
        [_trace_row(project=project, entry=entry, source=source) for entry in new],
        ignore_conflicts=True,
        batch_size=500,
    )
    tagged = [entry for entry in new if entry.item.tags]
    if tagged:
        _tag_new_traces(project=project, tagged=tagged, create_tags=create_tags)
    after_traces_changed(
        list(
            Trace.objects.filter(
                project=project, external_id__in=[entry.item.external_id for entry in new]
            ).values_list("id", flat=True)
        )
    )


def _tag_new_traces(*, project: Project, tagged: list[_Accepted], create_tags: bool) -> None:
    names = {name for entry in tagged for name in entry.item.tags}
    if create_tags:
        Tag.objects.bulk_create(
            [Tag(project=project, name=name) for name in names], ignore_conflicts=True
        )
    tag_ids = dict(Tag.objects.filter(project=project, name__in=names).values_list("name", "id"))
    trace_ids = dict(
        Trace.objects.filter(
            project=project, external_id__in=[entry.item.external_id for entry in tagged]
        ).values_list("external_id", "id")
    )
    TraceTag.objects.bulk_create(
        [
            TraceTag(trace_id=trace_ids[entry.item.external_id], tag_id=tag_ids[name])
            for entry in tagged
            for name in entry.item.tags
            if name in tag_ids
        ],
        ignore_conflicts=True,
    )
