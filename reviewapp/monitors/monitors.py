"""Environment monitors: how each model version meets its environment, and how that changes.

Counts, rates and averages come from the trace summary columns and the per-trace facts
(reviewapp/traces/facts.py: tool results and errors per tool, answers and their words, cut
replies), summed exactly; no body is opened. They are read from the rollups
(reviewapp/traces/rollups.py: the same sums per version, hour received and termination, kept
as traces are written) when the filters are ones the rollups can answer (version, termination,
dates); other filters (text, tags, outcome, review state) sum over every matching trace
(`monitor_of_traces`), one grouped query plus the errors per tool from the failing traces. Either
way the newest failing traces, the evidence, come from an indexed read of the newest failing
traces.
"""

import functools
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from urllib.parse import urlencode

from django.db import connection, transaction
from django.db.models import Count, F, IntegerField, Min, Q, QuerySet, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, TruncDay, TruncHour
from django.urls import reverse
from django.utils import timezone

from reviewapp.projects.models import Project
from reviewapp.review.models import Feedback
from reviewapp.traces.filters import BASE_ADAPTER, filtered_traces
from reviewapp.traces.models import (
    FAILURE_TERMINATIONS,
    Termination,
    ToolRollup,
    Trace,
    TraceRollup,
)


class _ConvertedOnce:
    """A Trunc that converts each distinct value it reads back once per query: Trunc makes
    every one aware, reading the settings and the current time zone for each row (about
    20 us a row, bench/monitors.py), and a monitor's rows share a few hundred periods."""

    def as_sql(self, compiler, connection, **extra_context):
        self._converted = {}  # a query is compiled each time it runs, before its rows are read
        return super().as_sql(compiler, connection, **extra_context)

    def convert_value(self, value, expression, connection):
        if value not in self._converted:
            self._converted[value] = super().convert_value(value, expression, connection)
        return self._converted[value]


class _TruncDay(_ConvertedOnce, TruncDay):
    pass


class _TruncHour(_ConvertedOnce, TruncHour):
    pass


BUCKETS = {"day": _TruncDay, "hour": _TruncHour}
EXAMPLES_KEPT = 5  # trace ids kept as evidence per version and per tool


def _rate(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _ratio(part: str, whole: str) -> property:
    """A property: the count named `part` over the count named `whole`, None while it is 0."""
    return property(lambda stats: _rate(getattr(stats, part), getattr(stats, whole)))


@dataclass(frozen=True)
class Version:
    """A model version as the traces name it: the served model and the adapter that answered."""

    model: str
    adapter_version: str

    @property
    def label(self) -> str:
        if self.adapter_version:
            return self.adapter_version
        return f"{self.model} (base)" if self.model else "unknown model"

    def trace_filters(self) -> dict:
        """The trace-list filters that select exactly this version's traces."""
        filters = {"adapter": self.adapter_version or BASE_ADAPTER}
        if self.model:
            filters["model"] = self.model
        return filters


@dataclass
class ToolStats:
    calls: int = 0  # tool results
    errors: int = 0
    failing_traces: int = 0  # traces with at least one of these errors
    error_examples: list[int] = field(default_factory=list)  # newest failing trace ids

    error_rate = _ratio("errors", "calls")


@dataclass
class GroupStats:
    """One version, overall or in one time bucket; counts and sums, so groups add up."""

    version: Version
    bucket: datetime | None
    traces: int = 0
    terminations: dict[str, int] = field(default_factory=dict)
    tool_calls: int = 0
    succeeded: int = 0
    failed: int = 0  # success False, or a failure termination
    with_feedback: int = 0
    first_seen: datetime | None = None
    tokens_total: int = 0
    tokens_reported: int = 0  # traces that report usage
    reward_total: float = 0.0
    rewarded: int = 0
    tool_results: int = 0
    tool_errors: int = 0
    # Traces with a failed tool call, whatever their termination (versions, with the per-tool
    # figures only): the traces the errors are in, which the "a tool call failed" filter lists.
    failing_traces: int = 0
    answers: int = 0  # assistant turns with text and no tool call
    answer_words: int = 0
    truncated_replies: int = 0
    answers_after_tool_error: int = 0  # answers written straight after a failed tool result
    # Per tool, filled for the version groups (not per bucket).
    tools: dict[str, ToolStats] = field(default_factory=lambda: defaultdict(ToolStats))

    tool_error_rate = _ratio("tool_errors", "tool_results")
    words_per_answer = _ratio("answer_words", "answers")
    # Of the failed tool calls, those the agent answered straight after instead of trying
    # again: it answers without the result it asked for (honestly, or making it up). A share
    # of the failures, so tools failing more often does not move it; the agent's habit does.
    answered_at_once_rate = _ratio("answers_after_tool_error", "tool_errors")
    completion_tokens = _ratio("tokens_total", "tokens_reported")
    reward = _ratio("reward_total", "rewarded")
    tool_calls_per_trace = _ratio("tool_calls", "traces")
    feedback_rate = _ratio("with_feedback", "traces")

    @property
    def error_examples(self) -> list[int]:
        """The newest traces with a failed tool call, oldest of them first."""
        ids = sorted({i for stats in self.tools.values() for i in stats.error_examples})
        return ids[-EXAMPLES_KEPT:]

    @property
    def timeout_rate(self) -> float | None:
        return _rate(self.terminations.get(Termination.TIMEOUT, 0), self.traces)

    @property
    def truncated_rate(self) -> float | None:
        """Replies cut at max_tokens: like timeouts, an environment limit the model can learn."""
        return _rate(self.terminations.get(Termination.TRUNCATED, 0), self.traces)

    @property
    def tool_error_termination_rate(self) -> float | None:
        return _rate(self.terminations.get(Termination.TOOL_ERROR, 0), self.traces)

    @property
    def success_rate(self) -> float | None:
        return _rate(self.succeeded, self.succeeded + self.failed)

    def rate_of(self, terminations: tuple[str, ...]) -> float | None:
        return _rate(sum(self.terminations.get(name, 0) for name in terminations), self.traces)


@dataclass
class Monitor:
    bucket: str
    versions: list[GroupStats]  # oldest version first
    series: list[GroupStats]  # per version and bucket, in time order

    @property
    def buckets(self) -> list[datetime]:
        return sorted({group.bucket for group in self.series if group.bucket is not None})


def _add_row(group: GroupStats, row: dict) -> None:
    """Fold one grouped row (a version's counts and sums in one period, with its traces per
    termination) into a group."""
    for termination, count in row["terminations"].items():
        group.terminations[termination] = group.terminations.get(termination, 0) + count
    group.traces += row["traces"]
    group.tool_calls += row["tool_calls"] or 0
    group.succeeded += row["succeeded"]
    group.failed += row["failed"]
    if group.first_seen is None or row["first_seen"] < group.first_seen:
        group.first_seen = row["first_seen"]
    group.tokens_total += row["tokens_total"] or 0
    group.tokens_reported += row["tokens_reported"]
    group.reward_total += row["reward_total"] or 0.0
    group.rewarded += row["rewarded"]
    group.tool_results += row["tool_result_sum"] or 0
    group.tool_errors += row["tool_error_sum"] or 0
    group.answers += row["answers"] or 0
    group.answer_words += row["answer_words"] or 0
    group.truncated_replies += row["truncated_replies"] or 0
    group.answers_after_tool_error += row["answers_after_tool_error"] or 0


def _one_termination(row: dict) -> dict:
    """A row grouped by termination as well, in `_add_row`'s terms: an episode that ended in a
    failure termination failed whatever its reported success said."""
    termination, count = row["termination"], row["traces"]
    if termination in FAILURE_TERMINATIONS:
        return {**row, "terminations": {termination: count}, "succeeded": 0, "failed": count}
    return {**row, "terminations": {termination: count}, "failed": row["unsuccessful"]}


def _fold(rows, feedback, tool_names: list[str] = ()) -> tuple[list[GroupStats], list[GroupStats]]:
    """Versions and (version, bucket) groups from grouped rows (model, adapter_version,
    period, traces per termination and the sums) and the traces with feedback per (version,
    period)."""
    series: dict[tuple, GroupStats] = {}
    versions: dict[Version, GroupStats] = {}
    for row in rows:
        version = Version(row["model"], row["adapter_version"])
        key = (version, row["period"])
        _add_row(series.setdefault(key, GroupStats(version, row["period"])), row)
        group = versions.setdefault(version, GroupStats(version, None))
        _add_row(group, row)
        for index, name in enumerate(tool_names):
            if row[f"tool_{index}"]:
                group.tools[name].calls += row[f"tool_{index}"]
    for row in feedback:
        version = Version(row["trace__model"], row["trace__adapter_version"])
        if (version, row["period"]) not in series:
            # Rollups that missed a trace changed behind the writers' backs (a raw UPDATE):
            # its feedback has no group to count in; the page still answers.
            continue
        series[(version, row["period"])].with_feedback += row["traces"]
        versions[version].with_feedback += row["traces"]
    # A label names an adapter whatever model served it: the model breaks ties.
    ordered_versions = sorted(
        versions.values(), key=lambda g: (g.first_seen, g.version.label, g.version.model)
    )
    ordered_series = sorted(
        series.values(), key=lambda g: (g.bucket, g.version.label, g.version.model)
    )
    return ordered_versions, ordered_series


def _with_feedback(feedback: QuerySet[Feedback], trunc) -> QuerySet:
    """Traces with feedback per (version, period); a few rows per trace at most."""
    return (
        feedback.annotate(period=trunc("trace__received_at"))
        .values("trace__model", "trace__adapter_version", "period")
        .annotate(traces=Count("trace", distinct=True))
    )


def _grouped(
    traces: QuerySet[Trace], trunc, tool_names: list[str]
) -> tuple[list[GroupStats], list[GroupStats]]:
    """Versions and (version, bucket) groups from one grouped query, plus one for feedback.

    Grouping by termination as well keeps the query to plain sums (no per-row FILTER or
    EXISTS); feedback is counted from its own table, which holds a few rows per trace at most.
    The results of each tool in `tool_names` are summed by name in the same pass (versions
    only): reading a key of the JSON costs next to nothing beside a row per key.
    """
    per_tool = {
        f"tool_{index}": Sum(Cast(KeyTextTransform(name, "tool_results"), IntegerField()))
        for index, name in enumerate(tool_names)
    }
    rows = (
        traces.annotate(period=trunc("received_at"))
        .values("model", "adapter_version", "period", "termination")
        .annotate(
            traces=Count("id"),
            first_seen=Min("received_at"),
            tool_calls=Sum("tool_call_count"),
            succeeded=Count("id", filter=Q(success=True)),
            unsuccessful=Count("id", filter=Q(success=False)),
            tokens_total=Sum("completion_tokens"),
            tokens_reported=Count("completion_tokens"),
            reward_total=Sum("reward"),
            rewarded=Count("reward"),
            tool_result_sum=Sum("tool_result_count"),
            tool_error_sum=Sum("tool_error_count"),
            answers=Sum("answer_count"),
            answer_words=Sum("answer_words"),
            truncated_replies=Sum("truncated_replies"),
            answers_after_tool_error=Sum("answers_after_tool_error"),
            **per_tool,
        )
    )
    feedback = _with_feedback(Feedback.objects.filter(trace__in=traces), trunc)
    return _fold(map(_one_termination, rows), feedback, tool_names)


# Per tool and version: the JSON {tool name: count} columns, one row per key. Only the function
# that turns a JSON object into (key, value) rows differs between the two databases.
_JSON_EACH = {
    "postgresql": "jsonb_each(facts.{column}) AS tool",
    "sqlite": "json_each(facts.{column}) AS tool",
}
_TOOL_TOTALS = """
    SELECT facts.model, facts.adapter_version, tool.key, SUM(CAST(tool.value AS integer))
    FROM ({traces}) AS facts CROSS JOIN {each}
    GROUP BY facts.model, facts.adapter_version, tool.key
"""
_TOOL_TRACES = """
    SELECT facts.model, facts.adapter_version, tool.key, COUNT(*)
    FROM ({traces}) AS facts CROSS JOIN {each}
    GROUP BY facts.model, facts.adapter_version, tool.key
"""
_TOOL_KEYS = "SELECT DISTINCT tool.key FROM ({traces}) AS facts CROSS JOIN {each}"
NAMED_TOOLS_MAX = 32  # tools summed by name in the grouped query; past it, a pass per JSON key
NEWEST_TRACES_FOR_NAMES = 2000  # the tools these traces called are summed by name
FAILING_CHUNK = 1000  # failing traces read at a time, newest first, to find the examples


def _json_rows(subset: QuerySet, column: str, statement: str, *params) -> list[tuple]:
    """Run `statement` over `subset`'s rows, one row per key of their JSON `column`."""
    inner, inner_params = subset.query.sql_with_params()
    each = _JSON_EACH[connection.vendor].format(column=connection.ops.quote_name(column))
    with connection.cursor() as cursor:
        cursor.execute(statement.format(traces=inner, each=each), [*inner_params, *params])
        return cursor.fetchall()


def _failing_tools(traces: QuerySet[Trace]) -> list[tuple]:
    """(model, adapter_version, tool, errors), from the traces with a failed tool call."""
    failing = traces.filter(tool_error_count__gt=0).values(
        "id", "model", "adapter_version", "tool_errors"
    )
    return _json_rows(failing, "tool_errors", _TOOL_TOTALS)


def _count_failing_traces(traces: QuerySet[Trace], versions: list[GroupStats]) -> None:
    """Each version's traces with a failed tool call, and per tool those with an error of it,
    so a version's "N failed calls in M traces" names the M traces its link opens.

    One grouped pass over the failing traces, a filtered count per tool that failed (a key
    test on the JSON, no row per key); past NAMED_TOOLS_MAX such tools, a row per key."""
    by_version = {group.version: group for group in versions}
    failing = traces.filter(tool_error_count__gt=0)
    names = sorted({name for g in versions for name, tool in g.tools.items() if tool.errors})
    named = names if len(names) <= NAMED_TOOLS_MAX else []
    per_tool = {
        f"tool_{index}": Count("id", filter=Q(tool_errors__has_key=name))
        for index, name in enumerate(named)
    }
    for row in failing.values("model", "adapter_version").annotate(count=Count("id"), **per_tool):
        group = by_version.get(Version(row["model"], row["adapter_version"]))
        if group is None:  # rollups that missed a trace: see _fold
            continue
        group.failing_traces = row["count"]
        for index, name in enumerate(named):
            if row[f"tool_{index}"]:
                group.tools[name].failing_traces = row[f"tool_{index}"]
    if named or not names:
        return
    rows = failing.values("id", "model", "adapter_version", "tool_errors")
    for model, adapter_version, name, count in _json_rows(rows, "tool_errors", _TOOL_TRACES):
        group = by_version.get(Version(model, adapter_version))
        if group is not None:
            group.tools[name].failing_traces = int(count)


def _newest_failing(traces: QuerySet[Trace], failing: list[tuple]) -> dict[tuple, list[int]]:
    """(version, tool) -> its newest failing trace ids, EXAMPLES_KEPT at most.

    Reads the failing traces newest first, a chunk at a time, until every tool that failed has
    its examples: usually the first chunk, and never more than the failing traces.
    """
    wanted = {
        (Version(model, adapter_version), name): min(EXAMPLES_KEPT, int(total))
        for model, adapter_version, name, total in failing
    }
    found: dict[tuple, list[int]] = defaultdict(list)
    newest_first = (
        traces.filter(tool_error_count__gt=0)
        .order_by("-id")
        .values_list("id", "model", "adapter_version", "tool_errors")
    )
    before = None
    while any(len(found[key]) < n for key, n in wanted.items()):
        chunk = newest_first.filter(id__lt=before) if before else newest_first
        rows = list(chunk[:FAILING_CHUNK])
        if not rows:
            break
        for trace_id, model, adapter_version, tool_errors in rows:
            for name in tool_errors:
                key = (Version(model, adapter_version), name)
                if len(found[key]) < wanted.get(key, 0):
                    found[key].append(trace_id)
        before = rows[-1][0]
    return found


def _likely_tool_names(traces: QuerySet[Trace], failing: list[tuple]) -> list[str]:
    """Every tool that failed, and those the newest traces called; `_fill_tools` checks that
    they are all there are."""
    newest = (
        traces.filter(tool_result_count__gt=0)
        .order_by("-id")
        .values("id", "model", "adapter_version", "tool_results")[:NEWEST_TRACES_FOR_NAMES]
    )
    names = {name for (name,) in _json_rows(newest, "tool_results", _TOOL_KEYS)}
    names |= {name for _, _, name, _ in failing}
    return sorted(names) if len(names) <= NAMED_TOOLS_MAX else []


def _fill_tools(traces: QuerySet[Trace], versions: list[GroupStats], failing: list[tuple]) -> None:
    """Each version's results (exact: recounted per JSON key unless the named tools account
    for all of them), errors and newest failing traces per tool."""
    by_version = {group.version: group for group in versions}
    if any(sum(tool.calls for tool in group.tools.values()) != group.tool_results
           for group in versions):  # fmt: skip
        results = traces.filter(tool_result_count__gt=0).values(
            "id", "model", "adapter_version", "tool_results"
        )
        for group in versions:
            group.tools.clear()
        for model, adapter_version, name, total in _json_rows(
            results, "tool_results", _TOOL_TOTALS
        ):
            by_version[Version(model, adapter_version)].tools[name].calls = int(total)
    for model, adapter_version, name, total in failing:
        by_version[Version(model, adapter_version)].tools[name].errors = int(total)
    for (version, name), trace_ids in _newest_failing(traces, failing).items():
        by_version[version].tools[name].error_examples = sorted(trace_ids)


def monitor_of_traces(
    *, traces: QuerySet[Trace], bucket: str = "day", per_tool: bool = True
) -> Monitor:
    """Per-version and per-bucket stats of these traces (a project's, already filtered),
    summed over every one of them.

    `per_tool=False` skips the per-tool figures, for pages that show none.
    """
    trunc = BUCKETS[bucket]
    traces = traces.order_by()
    with transaction.atomic():
        _without_jit()
        failing, names = [], []
        if per_tool:
            failing = _failing_tools(traces)
            names = _likely_tool_names(traces, failing)
        versions, series = _grouped(traces, trunc, names)
        if per_tool and versions:
            _fill_tools(traces, versions, failing)
            _count_failing_traces(traces, versions)
    return Monitor(bucket=bucket, versions=versions, series=series)


# The trace filters the rollups answer: they hold sums per version, hour and termination.
ROLLUP_FILTERS = {"model", "adapter", "termination", "since", "until", "sort", "bucket"}


def compute_monitor(
    *, project: Project, filters: dict | None = None, bucket: str = "day", per_tool: bool = True
) -> Monitor:
    """Per-version and per-bucket stats of the project's traces that match `filters` (cleaned
    TraceFilterForm data): from the rollups where the filters allow, else over the traces.
    Either way the figures are the same (tests/monitors/test_rollups.py).

    `per_tool=False` skips the per-tool figures, for pages that show none.
    """
    filters = {name: value for name, value in (filters or {}).items() if value}
    traces = filtered_traces(project, filters).order_by()
    if set(filters) - ROLLUP_FILTERS or not _hours_make_days():
        return monitor_of_traces(traces=traces, bucket=bucket, per_tool=per_tool)
    rollups = TraceRollup.objects.filter(project=project, **_rollup_filters(filters))
    feedback = Feedback.objects.filter(
        trace__project=project,
        **_rollup_filters(filters, prefix="trace__", time_field="received_at"),
    )
    versions, series = _fold(
        _rollup_groups(rollups, bucket), _with_feedback(feedback, BUCKETS[bucket])
    )
    if per_tool and versions:
        _rolled_up_tools(project, filters, traces, versions)
        with transaction.atomic():
            _without_jit()
            _count_failing_traces(traces, versions)
    return Monitor(bucket=bucket, versions=versions, series=series)


# The rollup columns summed per group, under `_add_row`'s names.
_ROLLUP_SUMS = {
    "traces": Sum("traces"),
    "first_seen": Min("first_seen"),
    "tool_calls": Sum("tool_calls"),
    "tokens_total": Sum("tokens_total"),
    "tokens_reported": Sum("tokens_reported"),
    "reward_total": Sum("reward_total"),
    "rewarded": Sum("rewarded"),
    "tool_result_sum": Sum("tool_results"),
    "tool_error_sum": Sum("tool_errors"),
    "answers": Sum("answers"),
    "answer_words": Sum("answer_words"),
    "truncated_replies": Sum("truncated_replies"),
    "answers_after_tool_error": Sum("answers_after_tool_error"),
}
_FAILURE_ENDED = Q(termination__in=FAILURE_TERMINATIONS)


def _rollup_groups(rollups: QuerySet[TraceRollup], bucket: str) -> list[dict]:
    """The rollup rows summed per (version, period), each termination's traces a column.

    One row per version and period, not per termination as well: at 1M traces the hours
    came back as 66,000 rows, and reading each one's two timestamps cost more than the
    query. An hour is a rollup row's stored bucket, read as it is (no Trunc)."""
    terminations = sorted(rollups.order_by().values_list("termination", flat=True).distinct())
    per_termination = {
        f"ended_{index}": Sum("traces", filter=Q(termination=name))
        for index, name in enumerate(terminations)
    }
    period = F("bucket") if bucket == "hour" else BUCKETS[bucket]("bucket")
    rows = (
        rollups.order_by()
        .annotate(period=period)
        .values("model", "adapter_version", "period")
        .annotate(
            **{f"sum_{name}": aggregate for name, aggregate in _ROLLUP_SUMS.items()},
            succeeded_as_reported=Sum("succeeded", filter=~_FAILURE_ENDED),
            failed_as_reported=Sum("unsuccessful", filter=~_FAILURE_ENDED),
            failure_ended=Sum("traces", filter=_FAILURE_ENDED),
            **per_termination,
        )
    )
    local = functools.cache(timezone.localtime)  # once per distinct period: as Trunc returns it
    return [
        {
            **{name: row[f"sum_{name}"] for name in _ROLLUP_SUMS},
            "model": row["model"],
            "adapter_version": row["adapter_version"],
            "period": local(row["period"]),
            "terminations": {
                name: row[f"ended_{index}"]
                for index, name in enumerate(terminations)
                if row[f"ended_{index}"] is not None
            },
            "succeeded": row["succeeded_as_reported"] or 0,
            "failed": (row["failed_as_reported"] or 0) + (row["failure_ended"] or 0),
        }
        for row in rows
    ]


def _hours_make_days() -> bool:
    """Whether the rollups' UTC hours fall whole into the current time zone's days (every
    zone but those half or quarter of an hour off UTC)."""
    offset = timezone.localtime().utcoffset() or timedelta()
    return offset % timedelta(hours=1) == timedelta()


def _day_start(day) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def _rollup_filters(filters: dict, *, prefix: str = "", time_field: str = "bucket") -> dict:
    """The ROLLUP_FILTERS as lookups on a rollup's columns (or a trace's, through `prefix`).

    A trace's bucket is the hour it was received in, and a day starts on the hour, so
    `bucket >= start of day` holds for exactly the traces received since then."""
    lookups = {}
    if filters.get("model"):
        lookups["model"] = filters["model"]
    if filters.get("adapter"):
        adapter = filters["adapter"]
        lookups["adapter_version"] = "" if adapter == BASE_ADAPTER else adapter
    if filters.get("termination"):
        lookups["termination__in"] = filters["termination"]
    if filters.get("since"):
        lookups[f"{time_field}__gte"] = _day_start(filters["since"])
    if filters.get("until"):
        lookups[f"{time_field}__lt"] = _day_start(filters["until"]) + timedelta(days=1)
    return {f"{prefix}{name}": value for name, value in lookups.items()}


def _rolled_up_tools(
    project: Project, filters: dict, traces: QuerySet[Trace], versions: list[GroupStats]
) -> None:
    """Each version's results and errors per tool from the rollups, and the newest failing
    traces from the traces (newest first, by the failing-traces index)."""
    by_version = {group.version: group for group in versions}
    totals = (
        ToolRollup.objects.filter(project=project, **_rollup_filters(filters))
        .values("model", "adapter_version", "tool")
        .annotate(results=Sum("results"), errors=Sum("errors"))
    )
    failing = []
    for row in totals:
        tool = by_version[Version(row["model"], row["adapter_version"])].tools[row["tool"]]
        tool.calls, tool.errors = row["results"], row["errors"]
        if row["errors"]:
            failing.append((row["model"], row["adapter_version"], row["tool"], row["errors"]))
    for (version, name), trace_ids in _newest_failing(traces, failing).items():
        by_version[version].tools[name].error_examples = sorted(trace_ids)


def _without_jit() -> None:
    """PostgreSQL guesses 100 rows from each JSON object, so over a big project the per-tool
    queries look costly enough to compile: compiling took longer than running them (2.8 s of
    JIT for a 1.2 s query at 100,000 traces, bench/monitors.py). For this transaction only."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")


def evidence_url(project: Project, filters: dict, **extra) -> str:
    """The trace list that shows the traces behind a number: the page's filters plus `extra`."""
    query = {key: value for key, value in {**filters, **extra}.items() if value not in ("", None)}
    return reverse("trace_list", args=[project.slug]) + "?" + urlencode(query, doseq=True)
