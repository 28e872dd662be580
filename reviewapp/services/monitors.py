"""Environment monitors: how each model version meets its environment, and how that changes.

Counts, rates and averages come from the trace summary columns, aggregated in SQL, so a project
of any size is one grouped query per view. What only a body can tell (which tool calls failed,
how long the answers are) comes from a bounded sample of bodies: the newest traces of each
version and time bucket, `BODY_BUDGET` bodies at most whatever the project's size.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlencode

from django.db.models import (
    Count,
    F,
    Min,
    Q,
    QuerySet,
    Sum,
    Window,
)
from django.db.models.functions import RowNumber, TruncDay, TruncHour
from django.urls import reverse

from reviewapp.filters import BASE_ADAPTER
from reviewapp.models import Feedback, Project, Termination, Trace
from reviewapp.rendering import looks_like_tool_error
from training.text import content_text

BUCKETS = {"day": TruncDay, "hour": TruncHour}
BODY_BUDGET = 2000  # bodies opened per monitor, at most
EXAMPLES_KEPT = 5  # trace ids kept as evidence per version and per tool
# An episode that ended like this is a failure whatever its reported success said.
FAILURE_TERMINATIONS = (
    Termination.TIMEOUT,
    Termination.TOOL_ERROR,
    Termination.MAX_STEPS,
    Termination.ERROR,
)


def _rate(part: float, whole: float) -> float | None:
    return part / whole if whole else None


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
    calls: int = 0  # tool results seen in the sampled bodies
    errors: int = 0
    error_examples: list[int] = field(default_factory=list)  # trace ids

    @property
    def error_rate(self) -> float | None:
        return _rate(self.errors, self.calls)


@dataclass
class BodyStats:
    """What the sampled bodies of one group say."""

    traces: int = 0
    answers: int = 0  # assistant turns with text and no tool call
    answer_words: int = 0
    tools: dict[str, ToolStats] = field(default_factory=lambda: defaultdict(ToolStats))

    @property
    def tool_results(self) -> int:
        return sum(stats.calls for stats in self.tools.values())

    @property
    def tool_errors(self) -> int:
        return sum(stats.errors for stats in self.tools.values())

    @property
    def tool_error_rate(self) -> float | None:
        return _rate(self.tool_errors, self.tool_results)

    @property
    def words_per_answer(self) -> float | None:
        return _rate(self.answer_words, self.answers)

    @property
    def error_examples(self) -> list[int]:
        ids = sorted({i for stats in self.tools.values() for i in stats.error_examples})
        return ids[-EXAMPLES_KEPT:]


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
    body: BodyStats = field(default_factory=BodyStats)

    @property
    def completion_tokens(self) -> float | None:
        return _rate(self.tokens_total, self.tokens_reported)

    @property
    def reward(self) -> float | None:
        return _rate(self.reward_total, self.rewarded)

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
    def tool_calls_per_trace(self) -> float | None:
        return _rate(self.tool_calls, self.traces)

    @property
    def success_rate(self) -> float | None:
        return _rate(self.succeeded, self.succeeded + self.failed)

    @property
    def feedback_rate(self) -> float | None:
        return _rate(self.with_feedback, self.traces)

    def rate_of(self, terminations: tuple[str, ...]) -> float | None:
        return _rate(sum(self.terminations.get(name, 0) for name in terminations), self.traces)


@dataclass
class Monitor:
    bucket: str
    versions: list[GroupStats]  # oldest version first
    series: list[GroupStats]  # per version and bucket, in time order
    bodies_read: int

    @property
    def buckets(self) -> list[datetime]:
        return sorted({group.bucket for group in self.series if group.bucket is not None})


def _add_row(group: GroupStats, row: dict) -> None:
    """Fold one (version, bucket, termination) row of the grouped query into a group."""
    termination, count = row["termination"], row["traces"]
    group.traces += count
    group.terminations[termination] = group.terminations.get(termination, 0) + count
    group.tool_calls += row["tool_calls"] or 0
    if termination in FAILURE_TERMINATIONS:
        group.failed += count
    else:
        group.succeeded += row["succeeded"]
        group.failed += row["unsuccessful"]
    if group.first_seen is None or row["first_seen"] < group.first_seen:
        group.first_seen = row["first_seen"]
    group.tokens_total += row["tokens_total"] or 0
    group.tokens_reported += row["tokens_reported"]
    group.reward_total += row["reward_total"] or 0.0
    group.rewarded += row["rewarded"]


def _grouped(traces: QuerySet[Trace], trunc) -> tuple[list[GroupStats], list[GroupStats]]:
    """Versions and (version, bucket) groups from one grouped query, plus one for feedback.

    Grouping by termination as well keeps the query to plain sums (no per-row FILTER or
    EXISTS); feedback is counted from its own table, which holds a few rows per trace at most.
    """
    rows = (
        traces.annotate(bucket=trunc("received_at"))
        .values("model", "adapter_version", "bucket", "termination")
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
        )
    )
    series: dict[tuple, GroupStats] = {}
    versions: dict[Version, GroupStats] = {}
    for row in rows:
        version = Version(row["model"], row["adapter_version"])
        key = (version, row["bucket"])
        _add_row(series.setdefault(key, GroupStats(version, row["bucket"])), row)
        _add_row(versions.setdefault(version, GroupStats(version, None)), row)
    feedback = (
        Feedback.objects.filter(trace__in=traces)
        .annotate(bucket=trunc("trace__received_at"))
        .values("trace__model", "trace__adapter_version", "bucket")
        .annotate(traces=Count("trace", distinct=True))
    )
    for row in feedback:
        version = Version(row["trace__model"], row["trace__adapter_version"])
        series[(version, row["bucket"])].with_feedback += row["traces"]
        versions[version].with_feedback += row["traces"]
    ordered_versions = sorted(versions.values(), key=lambda g: (g.first_seen, g.version.label))
    ordered_series = sorted(series.values(), key=lambda g: (g.bucket, g.version.label))
    return ordered_versions, ordered_series


def _read_body(stats: BodyStats, trace_id: int, messages: list) -> None:
    stats.traces += 1
    tool_names: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant":
            calls = message.get("tool_calls") or ()
            for call in calls:
                if isinstance(call, dict):
                    name = (call.get("function") or {}).get("name") or "unknown"
                    tool_names[call.get("id", "")] = str(name)
            text = content_text(message.get("content")).strip()
            if text and not calls:
                stats.answers += 1
                stats.answer_words += len(text.split())
        elif role == "tool":
            name = tool_names.get(message.get("tool_call_id", ""), "unknown")
            tool = stats.tools[name]
            tool.calls += 1
            if looks_like_tool_error(content_text(message.get("content"))):
                tool.errors += 1
                seen = trace_id in tool.error_examples
                if not seen and len(tool.error_examples) < EXAMPLES_KEPT:
                    tool.error_examples.append(trace_id)


def _sample_bodies(
    traces: QuerySet[Trace], trunc, groups: list[GroupStats], versions: list[GroupStats]
) -> int:
    """Fill each group's and version's BodyStats from the newest bodies of each group."""
    if not groups:
        return 0
    # Spread over the groups; past BODY_BUDGET groups, some groups go unsampled.
    per_group = max(1, BODY_BUDGET // len(groups))
    ranked = (
        traces.order_by()
        .annotate(
            bucket=trunc("received_at"),
            rank=Window(
                RowNumber(),
                partition_by=[F("model"), F("adapter_version"), trunc("received_at")],
                order_by=F("id").desc(),
            ),
        )
        .filter(rank__lte=per_group)
        .values_list("id", flat=True)
    )
    ids = list(ranked[:BODY_BUDGET])
    by_group = {(group.version, group.bucket): group for group in groups}
    by_version = {group.version: group for group in versions}
    rows = (
        Trace.objects.filter(pk__in=ids)
        .annotate(bucket=trunc("received_at"))
        .order_by("id")
        .values_list("id", "model", "adapter_version", "bucket", "body")
    )
    for trace_id, model, adapter_version, bucket, body in rows.iterator(chunk_size=200):
        version = Version(model, adapter_version)
        trace = Trace(body=body)
        messages = trace.body_json().get("messages") or []
        _read_body(by_group[(version, bucket)].body, trace_id, messages)
        _read_body(by_version[version].body, trace_id, messages)
    return len(ids)


def compute_monitor(
    *, traces: QuerySet[Trace], bucket: str = "day", read_bodies: bool = True
) -> Monitor:
    """Per-version and per-bucket stats of these traces (a project's, already filtered).

    `read_bodies=False` skips the body sample: SQL only, for pages that need no tool stats.
    """
    trunc = BUCKETS[bucket]
    traces = traces.order_by()
    versions, series = _grouped(traces, trunc)
    bodies_read = _sample_bodies(traces, trunc, series, versions) if read_bodies else 0
    return Monitor(bucket=bucket, versions=versions, series=series, bodies_read=bodies_read)


def evidence_url(project: Project, filters: dict, **extra) -> str:
    """The trace list that shows the traces behind a number: the page's filters plus `extra`."""
    query = {key: value for key, value in {**filters, **extra}.items() if value not in ("", None)}
    return reverse("trace_list", args=[project.slug]) + "?" + urlencode(query, doseq=True)
