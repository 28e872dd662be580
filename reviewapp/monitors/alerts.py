"""Pothole alerts: the environment teaching a model version something nobody asked for.

Computed on read from the monitors, comparing each version with the one before it (versions in
the order they first answered). Each alert says what moved, by how much, and links the traces
that show it. A version needs `MIN_TRACES` traces before it is compared at all.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from django.urls import reverse

from reviewapp.learning.dataset import DataPolicy, data_policy_for
from reviewapp.monitors.monitors import GroupStats, Monitor, compute_monitor, evidence_url
from reviewapp.projects.models import Project
from reviewapp.traces.filters import ANSWERED_ON_FAILURE
from reviewapp.traces.models import Termination

MIN_TRACES = 20
HIGH_TOOL_ERROR_RATE = 0.05  # tool calls failing at least this often count as "high"
SHRINK = 0.2  # answers or tool use falling by a fifth or more
RISE_POINTS = 0.05  # a timeout or excluded share rising by 5 points or more...
RISE_FACTOR = 1.5  # ...and by half again at least
TOOL_JUMP_POINTS = 0.10  # one tool's failure rate rising by 10 points or more
MIN_TOOL_CALLS = 5  # per tool and version, before its failure rate is compared


@dataclass(frozen=True)
class Evidence:
    label: str
    url: str


@dataclass(frozen=True)
class Alert:
    # shrinking_under_tool_errors | answering_on_failed_tools | timeouts_rising |
    # exclusions_rising | tool_failure_jump
    kind: str
    severity: str  # warning | critical
    version: str
    previous_version: str
    message: str
    evidence: list[Evidence] = field(default_factory=list)

    def as_json(self) -> dict:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "version": self.version,
            "previous_version": self.previous_version,
            "message": self.message,
            "evidence": [{"label": item.label, "url": item.url} for item in self.evidence],
        }


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _fell(before: float | None, after: float | None) -> float | None:
    """The relative fall from before to after (0.25 = a quarter less), None if unknown."""
    if before is None or after is None or before <= 0:
        return None
    return (before - after) / before


def _rose(before: float | None, after: float | None) -> bool:
    if before is None or after is None:
        return False
    return after - before >= RISE_POINTS and after >= RISE_FACTOR * before


class _Checker:
    def __init__(self, project: Project, filters: dict, policy: DataPolicy) -> None:
        self.project = project
        self.filters = filters
        self.policy = policy

    def url(self, group: GroupStats, **extra) -> str:
        return evidence_url(self.project, self.filters, **group.version.trace_filters(), **extra)

    def alert(
        self,
        old: GroupStats,
        new: GroupStats,
        *,
        kind: str,
        critical: bool,
        message: str,
        evidence: list[Evidence],
    ) -> Alert:
        """What moved between `old` and the version after it, `new`."""
        return Alert(
            kind=kind,
            severity="critical" if critical else "warning",
            version=new.version.label,
            previous_version=old.version.label,
            message=message,
            evidence=evidence,
        )

    def all_traces(self, group: GroupStats) -> Evidence:
        return Evidence(f"{group.version.label}: all traces", self.url(group))

    def examples(self, trace_ids: list[int]) -> list[Evidence]:
        slug = self.project.slug
        return [
            Evidence(f"trace {trace_id}", reverse("trace_detail", args=[slug, trace_id]))
            for trace_id in trace_ids
        ]

    def shrinking_under_tool_errors(self, old: GroupStats, new: GroupStats) -> Alert | None:
        error_rate = new.tool_error_rate
        if error_rate is None or error_rate < HIGH_TOOL_ERROR_RATE:
            return None
        words_fell = _fell(old.words_per_answer, new.words_per_answer)
        tools_fell = _fell(old.tool_calls_per_trace, new.tool_calls_per_trace)
        changes = []
        if words_fell is not None and words_fell >= SHRINK:
            changes.append(
                f"answers {100 * words_fell:.0f}% shorter ({old.words_per_answer:.1f} → "
                f"{new.words_per_answer:.1f} words)"
            )
        if tools_fell is not None and tools_fell >= SHRINK:
            changes.append(
                f"{100 * tools_fell:.0f}% fewer tool calls per trace "
                f"({old.tool_calls_per_trace:.2f} → {new.tool_calls_per_trace:.2f})"
            )
        if not changes:
            return None
        worst = max(value for value in (words_fell, tools_fell) if value is not None)
        return self.alert(
            old,
            new,
            kind="shrinking_under_tool_errors",
            critical=worst >= 2 * SHRINK or error_rate >= 0.2,
            message=(
                f"{new.version.label}: {' and '.join(changes)} while "
                f"{_percent(error_rate)} of tool calls fail (was "
                f"{_percent(old.tool_error_rate)} in {old.version.label}; "
                f"{new.tool_results} tool results in {new.traces} traces)"
            ),
            evidence=[
                self.all_traces(new),
                Evidence(
                    f"{new.version.label}: ended in a tool error",
                    self.url(new, termination=Termination.TOOL_ERROR),
                ),
                self.all_traces(old),
                *self.examples(new.error_examples),
            ],
        )

    def answering_on_failed_tools(self, old: GroupStats, new: GroupStats) -> Alert | None:
        """More of the failed tool calls answered straight away, without the result asked for:
        the agent gives up on a failing tool, or makes up what it would have said. Compared
        only where both versions met failures."""
        return self.rising_share(
            old,
            new,
            kind="answering_on_failed_tools",
            share_of=lambda group: group.answered_at_once_rate,
            says=lambda group, share: (
                f"answers straight after {_percent(share)} of its failed tool calls "
                f"({group.answers_after_tool_error} of {group.tool_errors}) instead of trying again"
            ),
            evidence_label="answered straight after a failed call",
            tool_failure=ANSWERED_ON_FAILURE,
        )

    def terminations_rising(
        self, old: GroupStats, new: GroupStats, *, kind: str, terminations: tuple[str, ...]
    ) -> Alert | None:
        what = "timed out" if kind == "timeouts_rising" else "excluded from training by policy"
        return self.rising_share(
            old,
            new,
            kind=kind,
            share_of=lambda group: group.rate_of(terminations),
            says=lambda group, share: (
                f"{_percent(share)} of traces {what} "
                f"({sum(group.terminations.get(t, 0) for t in terminations)} of {group.traces})"
            ),
            evidence_label=" or ".join(terminations),
            termination=list(terminations),
        )

    def rising_share(
        self,
        old: GroupStats,
        new: GroupStats,
        *,
        kind: str,
        share_of: Callable[[GroupStats], float | None],
        says: Callable[[GroupStats, float], str],
        evidence_label: str,
        **evidence_filters,
    ) -> Alert | None:
        """An alert when a share rose from `old` to `new` (see _rose), with both versions'
        traces behind it as evidence; `says` words the new version's share."""
        before, after = share_of(old), share_of(new)
        if not _rose(before, after):
            return None
        return self.alert(
            old,
            new,
            kind=kind,
            critical=after - before >= 2 * RISE_POINTS,
            message=(
                f"{new.version.label}: {says(new, after)}, "
                f"up from {_percent(before)} in {old.version.label}"
            ),
            evidence=[
                Evidence(
                    f"{group.version.label}: {evidence_label}", self.url(group, **evidence_filters)
                )
                for group in (new, old)
            ],
        )

    def tool_failure_jumps(self, old: GroupStats, new: GroupStats) -> list[Alert]:
        alerts = []
        for name, tool in sorted(new.tools.items()):
            before_tool = old.tools.get(name)
            if before_tool is None or min(tool.calls, before_tool.calls) < MIN_TOOL_CALLS:
                continue
            before, after = before_tool.error_rate, tool.error_rate
            if after - before < TOOL_JUMP_POINTS:
                continue
            alerts.append(
                self.alert(
                    old,
                    new,
                    kind="tool_failure_jump",
                    critical=after - before >= 2.5 * TOOL_JUMP_POINTS,
                    message=(
                        f"tool {name!r} fails {_percent(after)} of the time in "
                        f"{new.version.label} ({tool.errors} of {tool.calls} calls), "
                        f"up from {_percent(before)} in {old.version.label} "
                        f"({before_tool.errors} of {before_tool.calls})"
                    ),
                    evidence=[self.all_traces(new), *self.examples(tool.error_examples)],
                )
            )
        return alerts


def alerts_from_monitor(
    *, project: Project, monitor: Monitor, policy: DataPolicy, filters: dict | None = None
) -> list[Alert]:
    """Every alert between consecutive versions with enough traces, newest version first."""
    checker = _Checker(project, filters or {}, policy)
    compared = [group for group in monitor.versions if group.traces >= MIN_TRACES]
    alerts: list[Alert] = []
    for old, new in pairwise(compared):
        found = [
            checker.shrinking_under_tool_errors(old, new),
            checker.answering_on_failed_tools(old, new),
            checker.terminations_rising(
                old, new, kind="timeouts_rising", terminations=(Termination.TIMEOUT,)
            ),
        ]
        excluded = policy.excluded_terminations()
        if excluded:
            found.append(
                checker.terminations_rising(
                    old, new, kind="exclusions_rising", terminations=excluded
                )
            )
        alerts += [alert for alert in found if alert is not None]
        alerts += checker.tool_failure_jumps(old, new)
    return list(reversed(alerts))


def project_alerts(*, project: Project) -> list[Alert]:
    """The project's alerts over all its traces."""
    try:
        policy = data_policy_for(project)
    except ValueError:
        policy = DataPolicy()
    monitor = compute_monitor(project=project, bucket="day")
    return alerts_from_monitor(project=project, monitor=monitor, policy=policy)
