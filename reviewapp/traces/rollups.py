"""Rollups: the monitors' counts and sums kept as traces are written, per (project, model,
adapter version, hour received, termination), so a monitor reads a few rows per version and hour
instead of every trace (models `TraceRollup`, `ToolRollup`).

Every writer of a trace's summary columns or facts (ingest, the gateway's recorder, the outcome
endpoint) calls `roll_up_traces` with the ids it wrote, in its transaction, after writing. What
the rollups count for each trace is kept beside them (`RolledUpTrace`): its old share is taken
out and its share as stored now put in, one upsert per table adding the differences. So the
rollups equal a grouped pass over the traces (`rebuild_rollups`) after every commit, whatever
the writer changed, as long as it names the traces it wrote.
"""

import functools
import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.apps import apps as installed_apps
from django.db import connection, transaction
from django.db.models import Count, Min, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, TruncHour

from reviewapp.traces.facts import FACT_COLUMNS

# The trace columns a trace's share is made of (the `RolledUpTrace` fields but its id).
SHARE_FIELDS = [
    "project_id",
    "model",
    "adapter_version",
    "termination",
    "received_at",
    "success",
    "reward",
    "completion_tokens",
    "tool_call_count",
    *FACT_COLUMNS,
]
KEY_COLUMNS = ["project_id", "model", "adapter_version", "bucket", "termination"]
SUM_COLUMNS = [
    "traces",
    "succeeded",
    "unsuccessful",
    "tool_calls",
    "tokens_total",
    "tokens_reported",
    "reward_total",
    "rewarded",
    "tool_results",
    "tool_errors",
    "answers",
    "answer_words",
    "truncated_replies",
    "answers_after_tool_error",
]
ROWS_PER_STATEMENT = 100  # SQLite allows 999 parameters a statement in older builds
Key = tuple[int, str, str, datetime, str]


def hour_of(moment: datetime) -> datetime:
    """The rollup bucket of a trace received at `moment`: the hour, in UTC."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _key(share: dict) -> Key:
    return (
        share["project_id"],
        share["model"],
        share["adapter_version"],
        hour_of(share["received_at"]),
        share["termination"],
    )


def _sums(share: dict) -> list[float]:
    """One trace's part of each SUM_COLUMNS column."""
    tokens, reward = share["completion_tokens"], share["reward"]
    return [
        1,
        int(share["success"] is True),
        int(share["success"] is False),
        share["tool_call_count"],
        tokens or 0,
        int(tokens is not None),
        reward or 0.0,
        int(reward is not None),
        share["tool_result_count"],
        share["tool_error_count"],
        share["answer_count"],
        share["answer_words"],
        share["truncated_replies"],
        share["answers_after_tool_error"],
    ]


class _Changes:
    """The differences a set of trace writes makes to the rollups, per row."""

    def __init__(self) -> None:
        self.sums: dict[Key, list[float]] = defaultdict(lambda: [0] * len(SUM_COLUMNS))
        self.first_seen: dict[Key, datetime] = {}  # earliest received_at put in, per row
        self.left: set[Key] = set()  # rows a trace left: their first_seen is looked up again
        self.tools: dict[tuple[Key, str], list[int]] = defaultdict(lambda: [0, 0])

    def move(self, old: dict | None, new: dict | None) -> None:
        if old == new:
            return
        if old is not None:
            self._add(old, -1)
            if new is None or _key(new) != _key(old):
                self.left.add(_key(old))
        if new is not None:
            self._add(new, 1)
            key = _key(new)
            seen = self.first_seen.get(key)
            if seen is None or new["received_at"] < seen:
                self.first_seen[key] = new["received_at"]

    def _add(self, share: dict, sign: int) -> None:
        key = _key(share)
        sums = self.sums[key]
        for index, value in enumerate(_sums(share)):
            sums[index] += sign * value
        for column, slot in (("tool_results", 0), ("tool_errors", 1)):
            for name, count in (share[column] or {}).items():
                self.tools[(key, name)][slot] += sign * int(count)


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _db_key(key: Key) -> list:
    project_id, model, adapter_version, bucket, termination = key
    return [
        project_id,
        model,
        adapter_version,
        connection.ops.adapt_datetimefield_value(bucket),
        termination,
    ]


def _conflict_sets(model, adds: list[str], replaces: list[str], first_seen: bool) -> list[str]:
    """ON CONFLICT's SET: `adds` columns add the new row's value to the stored one, `replaces`
    take the new value, first_seen keeps the earlier of the two (a NULL one is ignored)."""
    table, quote = _table(model), connection.ops.quote_name
    sets = [f"{quote(c)} = {table}.{quote(c)} + excluded.{quote(c)}" for c in adds]
    sets += [f"{quote(c)} = excluded.{quote(c)}" for c in replaces]
    if first_seen:
        stored, new = f"{table}.{quote('first_seen')}", f"excluded.{quote('first_seen')}"
        sets.append(
            f"{quote('first_seen')} = CASE WHEN {new} IS NULL THEN {stored}"
            f" WHEN {stored} IS NULL OR {new} < {stored} THEN {new} ELSE {stored} END"
        )
    return sets


def _upsert(model, keys: list[str], adds: list[str], rows: list[list], first_seen: bool) -> None:
    """INSERT the rows, or add their `adds` columns to the stored row with the same `keys`."""
    table, quote = _table(model), connection.ops.quote_name
    columns = keys + adds + (["first_seen"] if first_seen else [])
    sets = _conflict_sets(model, adds, [], first_seen)
    row_sql = "(" + ", ".join(["%s"] * len(columns)) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start : start + ROWS_PER_STATEMENT]
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(map(quote, columns))})"
                f" VALUES {', '.join([row_sql] * len(chunk))}"
                f" ON CONFLICT ({', '.join(map(quote, keys))}) DO UPDATE SET {', '.join(sets)}",
                [value for row in chunk for value in row],
            )


@functools.cache
def _document_upsert(
    model, keys: tuple[str, ...], adds: tuple[str, ...], replaces: tuple[str, ...], first_seen: bool
) -> str:
    """`_upsert`'s statement (PostgreSQL) for rows sent as one JSON document, a list of
    objects keyed by column (`jsonb_populate_recordset`, as calls.insert_rows)."""
    table, quote = _table(model), connection.ops.quote_name
    columns = ", ".join(map(quote, [*keys, *adds, *replaces, *(["first_seen"] * first_seen)]))
    sets = _conflict_sets(model, list(adds), list(replaces), first_seen)
    return (
        f"INSERT INTO {table} ({columns}) SELECT {columns}"
        f" FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)"
        f" ON CONFLICT ({', '.join(map(quote, keys))}) DO UPDATE SET {', '.join(sets)}"
    )


def _models(apps=None) -> tuple:
    registry = apps or installed_apps
    return tuple(
        registry.get_model("reviewapp", name)
        for name in ("Trace", "RolledUpTrace", "TraceRollup", "ToolRollup")
    )


def _columns(model) -> set[str]:
    return {field.attname for field in model._meta.concrete_fields}


def roll_up_traces(*, trace_ids: Iterable[int]) -> None:
    """Bring the rollups up to date with these traces as stored now (a trace that is gone is
    taken out). Call it in the transaction that wrote them, after the writes."""
    Trace, RolledUpTrace, TraceRollup, ToolRollup = _models()
    ids = sorted(set(trace_ids))
    if not ids:
        return
    with transaction.atomic(savepoint=False):
        stored, counted = _shares(ids, Trace, RolledUpTrace)
        changes = _Changes()
        for trace_id in ids:
            changes.move(counted.get(trace_id), stored.get(trace_id))
        changed = {
            trace_id: share for trace_id, share in stored.items() if counted.get(trace_id) != share
        }
        _write(changes, changed, Trace, RolledUpTrace, TraceRollup, ToolRollup)
        gone = [trace_id for trace_id in counted if trace_id not in stored]
        if gone:
            RolledUpTrace.objects.filter(trace_id__in=gone).delete()


def _on_postgresql() -> bool:
    """Whether the rollups of a batch go by statements of our own (PostgreSQL's dialect), or by
    the ORM as on SQLite."""
    return connection.vendor == "postgresql"


def _shares(ids: list[int], Trace, RolledUpTrace) -> tuple[dict[int, dict], dict[int, dict]]:
    """Each trace's share as stored now, and as the rollups count it, by trace id.

    Locking the traces orders two writers rolling up the same trace. On PostgreSQL statements
    of our own, built once (the ORM compiled its two queries again every batch)."""
    if not _on_postgresql():
        stored = {
            row.pop("id"): row
            for row in Trace.objects.select_for_update()
            .filter(pk__in=ids)
            .order_by("pk")
            .values("id", *SHARE_FIELDS)
        }
        counted = {
            row.pop("trace_id"): row
            for row in RolledUpTrace.objects.filter(trace_id__in=ids).values(
                "trace_id", *SHARE_FIELDS
            )
        }
        return stored, counted
    # Two statements: the second's snapshot is taken once the first holds the locks, so it
    # sees the RolledUpTrace rows of a writer that held them before.
    lock_stored, read_counted = _read_statements(Trace, RolledUpTrace)
    with connection.cursor() as cursor:
        cursor.execute(lock_stored, [ids])
        stored = _shares_of(cursor.fetchall())
        cursor.execute(read_counted, [ids])
        counted = _shares_of(cursor.fetchall())
    return stored, counted


_JSON_SHARE_SLOTS = [SHARE_FIELDS.index("tool_results"), SHARE_FIELDS.index("tool_errors")]


def _shares_of(rows: list[tuple]) -> dict[int, dict]:
    """Shares by trace id from `_read_statements`' rows, as `.values()` gives them."""
    shares = {}
    for trace_id, *values in rows:
        for index in _JSON_SHARE_SLOTS:  # jsonb comes back as text to Django's cursors
            if values[index] is not None:
                values[index] = orjson.loads(values[index])
        shares[trace_id] = dict(zip(SHARE_FIELDS, values, strict=True))
    return shares


@functools.cache
def _read_statements(Trace, RolledUpTrace) -> tuple[str, str]:
    """`_shares`' statements on PostgreSQL: the traces' shares, locked in id order (as
    select_for_update().order_by("pk")), and their RolledUpTrace rows."""
    quote = connection.ops.quote_name
    columns = ", ".join(map(quote, SHARE_FIELDS))
    pk = quote(Trace._meta.pk.column)
    return (
        f"SELECT {pk}, {columns} FROM {_table(Trace)} WHERE {pk} = ANY(%s)"
        f" ORDER BY {pk} FOR UPDATE",
        f"SELECT trace_id, {columns} FROM {_table(RolledUpTrace)} WHERE trace_id = ANY(%s)",
    )


def _write(
    changes: _Changes, changed: dict[int, dict], Trace, RolledUpTrace, TraceRollup, ToolRollup
) -> None:
    """Add the changes to the rollups and keep the changed shares (`RolledUpTrace`)."""
    rows = [
        [*key, *sums, changes.first_seen.get(key)]
        for key, sums in sorted(changes.sums.items())
        if any(sums) or key in changes.first_seen
    ]
    tool_rows = [
        [*key, name, results, errors]
        for (key, name), (results, errors) in sorted(changes.tools.items())
        if results or errors
    ]
    if _on_postgresql() and _fits_json(rows, changed):
        _write_in_one_statement(rows, tool_rows, changed, RolledUpTrace, TraceRollup, ToolRollup)
    else:
        if rows:
            rows = [[*_db_key(row[:5]), *row[5:-1], _adapt(row[-1])] for row in rows]
            _upsert(TraceRollup, KEY_COLUMNS, SUM_COLUMNS, rows, first_seen=True)
        if tool_rows:
            tool_rows = [[*_db_key(row[:5]), *row[5:]] for row in tool_rows]
            _upsert(ToolRollup, [*KEY_COLUMNS, "tool"], ["results", "errors"], tool_rows, False)
        if changed:
            RolledUpTrace.objects.bulk_create(
                [RolledUpTrace(trace_id=trace_id, **share) for trace_id, share in changed.items()],
                update_conflicts=True,
                unique_fields=["trace_id"],
                update_fields=SHARE_FIELDS,
            )
    emptied_tools = [
        Q(**dict(zip(KEY_COLUMNS, key, strict=True)), tool=name)
        for (key, name), (results, errors) in changes.tools.items()
        if results < 0 or errors < 0
    ]
    if emptied_tools:
        _any(ToolRollup.objects, emptied_tools).filter(results=0, errors=0).delete()
    for key in sorted(changes.left):
        _recount_first_seen(key, TraceRollup, Trace)


_REWARD_TOTAL = len(KEY_COLUMNS) + SUM_COLUMNS.index("reward_total")


def _fits_json(rows: list[list], changed: dict[int, dict]) -> bool:
    """Whether JSON carries every value: not a NaN or infinite reward (orjson writes null)."""
    rewards = [row[_REWARD_TOTAL] for row in rows]
    rewards += [share["reward"] for share in changed.values() if share["reward"] is not None]
    return all(map(math.isfinite, rewards))


def _write_in_one_statement(
    rows: list[list], tool_rows: list[list], changed: dict[int, dict],
    RolledUpTrace, TraceRollup, ToolRollup,
) -> None:  # fmt: skip
    """`_write`'s upserts on PostgreSQL: one statement (the others in WITH), each table's rows
    one JSON document. The ORM's upsert of RolledUpTrace (~17 values a row through Django's
    compiler) was most of the rollups' CPU, and each statement costs the recorder ~0.2 ms
    (bench/README.md, gateway.py)."""
    parts = []
    if rows:
        statement = _document_upsert(
            TraceRollup, tuple(KEY_COLUMNS), tuple(SUM_COLUMNS), (), first_seen=True
        )
        columns = [*KEY_COLUMNS, *SUM_COLUMNS, "first_seen"]
        parts.append((statement, [dict(zip(columns, row, strict=True)) for row in rows]))
    if tool_rows:
        statement = _document_upsert(
            ToolRollup, (*KEY_COLUMNS, "tool"), ("results", "errors"), (), first_seen=False
        )
        columns = [*KEY_COLUMNS, "tool", "results", "errors"]
        parts.append((statement, [dict(zip(columns, row, strict=True)) for row in tool_rows]))
    if changed:
        # As bulk_create(update_conflicts=True, update_fields=SHARE_FIELDS): a stored row takes
        # every share column of the new one.
        statement = _document_upsert(
            RolledUpTrace, ("trace_id",), (), tuple(SHARE_FIELDS), first_seen=False
        )
        parts.append(
            (statement, [{"trace_id": trace_id, **share} for trace_id, share in changed.items()])
        )
    if not parts:
        return
    *first, last = [statement for statement, _ in parts]
    ctes = ", ".join(f"upsert_{index} AS ({statement})" for index, statement in enumerate(first))
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {ctes} {last}" if first else last,
            [orjson.dumps(document).decode() for _, document in parts],
        )


def _any(manager, conditions: list[Q]) -> QuerySet:
    combined = Q()
    for condition in conditions:
        combined |= condition
    return manager.filter(combined)


def _adapt(moment: datetime | None):
    return None if moment is None else connection.ops.adapt_datetimefield_value(moment)


def _recount_first_seen(key: Key, TraceRollup, Trace) -> None:
    """A trace left this row: drop it if it is empty, else find its earliest trace again (in
    the hour's traces, by the received_at index)."""
    project_id, model, adapter_version, bucket, termination = key
    row = TraceRollup.objects.filter(**dict(zip(KEY_COLUMNS, key, strict=True)))
    if row.filter(traces=0).delete()[0]:
        return
    first = Trace.objects.filter(
        project_id=project_id,
        received_at__gte=bucket,
        received_at__lt=bucket + timedelta(hours=1),
        model=model,
        adapter_version=adapter_version,
        termination=termination,
    ).aggregate(first=Min("received_at"))["first"]
    row.update(first_seen=first)


def rebuild_rollups(*, project_ids: list[int] | None = None, apps=None) -> None:
    """Compute the rollups of these projects (all by default) again from their traces.

    For a database that has traces and no rollups (migration 0021), and to repair. `apps`: a
    migration's app registry; its models may predate columns added since, which are left out.
    """
    Trace, RolledUpTrace, TraceRollup, ToolRollup = _models(apps)
    scope = Q(project_id__in=project_ids) if project_ids is not None else Q()
    rolled_up_columns, rollup_columns = _columns(RolledUpTrace), _columns(TraceRollup)
    shared = [name for name in SHARE_FIELDS if name in rolled_up_columns]
    sums = {
        name: total
        for name, total in _rollup_sums().items()
        if _RENAMED.get(name, name) in rollup_columns
    }
    with transaction.atomic():
        for model in (ToolRollup, TraceRollup, RolledUpTrace):
            model.objects.filter(scope).delete()
        traces = Trace.objects.filter(scope).order_by().values("id", *shared)
        _insert_select(RolledUpTrace, traces, {"id": "trace_id"})
        counted = RolledUpTrace.objects.filter(scope).order_by()
        hours = counted.annotate(hour=TruncHour("received_at", tzinfo=UTC))
        grouped = hours.values("project_id", "model", "adapter_version", "hour", "termination")
        _insert_select(TraceRollup, grouped.annotate(**sums), {"hour": "bucket"})
        _insert_tools(ToolRollup, hours)


def _rollup_sums() -> dict[str, Any]:
    def total(column: str):
        return Coalesce(Sum(column), Value(0))

    return {
        "traces": Count("trace_id"),
        "first_seen": Min("received_at"),
        "succeeded": Count("trace_id", filter=Q(success=True)),
        "unsuccessful": Count("trace_id", filter=Q(success=False)),
        "tool_calls": total("tool_call_count"),
        "tokens_total": total("completion_tokens"),
        "tokens_reported": Count("completion_tokens"),
        "reward_total": Coalesce(Sum("reward"), Value(0.0)),
        "rewarded": Count("reward"),
        "tool_results_sum": total("tool_result_count"),
        "tool_errors_sum": total("tool_error_count"),
        "answers": total("answer_count"),
        "answer_words_sum": total("answer_words"),
        "truncated_replies_sum": total("truncated_replies"),
        "answers_after_tool_error_sum": total("answers_after_tool_error"),
    }


# Names a grouped query gives a column where the rollup's name is taken by a trace column.
_RENAMED = {
    "tool_results_sum": "tool_results",
    "tool_errors_sum": "tool_errors",
    "answer_words_sum": "answer_words",
    "truncated_replies_sum": "truncated_replies",
    "answers_after_tool_error_sum": "answers_after_tool_error",
}


def _insert_select(model, queryset: QuerySet, renamed: dict[str, str]) -> None:
    """INSERT INTO model's table the rows of a values() queryset, its columns by name."""
    query = queryset.query
    names = [*query.values_select, *query.annotation_select]
    renamed = {**_RENAMED, **renamed}
    quote = connection.ops.quote_name
    columns = ", ".join(quote(renamed.get(name, name)) for name in names)
    select, params = query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_table(model)} ({columns})"
            f" SELECT {', '.join(map(quote, names))} FROM ({select}) AS grouped",
            params,
        )


# One row per key of a JSON {tool name: count} column; only the function differs by database.
_JSON_EACH = {"postgresql": "jsonb_each", "sqlite": "json_each"}
_TOOL_PARTS = """
    SELECT facts.project_id, facts.model, facts.adapter_version, facts.hour, facts.termination,
           {alias}.key AS tool, {results} AS results, {errors} AS errors
    FROM ({inner}) AS facts CROSS JOIN {each}(facts.{column}) AS {alias}
"""


def _insert_tools(ToolRollup, hours: QuerySet) -> None:
    """ToolRollup rows from the per-trace JSON counts, results and errors summed per tool."""
    inner, params = (
        hours.filter(tool_result_count__gt=0)
        .values(
            "project_id",
            "model",
            "adapter_version",
            "hour",
            "termination",
            "tool_results",
            "tool_errors",
        )
        .query.sql_with_params()
    )
    each = _JSON_EACH[connection.vendor]
    parts = [
        _TOOL_PARTS.format(
            inner=inner, each=each, column="tool_results", alias="r",
            results="CAST(r.value AS integer)", errors="0",
        ),
        _TOOL_PARTS.format(
            inner=inner, each=each, column="tool_errors", alias="e",
            results="0", errors="CAST(e.value AS integer)",
        ),
    ]  # fmt: skip
    keys = "project_id, model, adapter_version, hour, termination, tool"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_table(ToolRollup)}"
            " (project_id, model, adapter_version, bucket, termination, tool, results, errors)"
            f" SELECT {keys}, SUM(results), SUM(errors)"
            f" FROM ({' UNION ALL '.join(parts)}) AS parts GROUP BY {keys}",
            [*params, *params],
        )
