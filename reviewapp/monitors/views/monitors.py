"""Environment monitors and pothole alerts per model version; the training-data accounting page."""

from dataclasses import dataclass
from datetime import timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from reviewapp.charts import multi_line_chart, stacked_bar_chart
from reviewapp.fragments import render_page
from reviewapp.learning.dataset import build_training_set, data_policy_for, set_data_policy
from reviewapp.learning.models import TargetState
from reviewapp.monitors.alerts import alerts_from_monitor, project_alerts
from reviewapp.monitors.forms import MonitorForm
from reviewapp.monitors.monitors import GroupStats, Monitor, compute_monitor, evidence_url
from reviewapp.monitors.refusals import recent_refusals
from reviewapp.projects.access import (
    get_admin_membership_for_user,
    get_membership_for_user,
)
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import POLICY_CHOICES, DataPolicy
from reviewapp.traces.filters import ANSWERED_ON_FAILURE, FAILED_EPISODE, TOOL_FAILED
from reviewapp.traces.models import Termination

ALERT_COUNT_SECONDS = 60  # the nav's alert count is recomputed at most this often per project
HOUR_BUCKET_DAYS = 14  # per hour, the page covers this many days unless "since" says otherwise


class DataPolicyForm(forms.Form):
    timeout = forms.ChoiceField(choices=[(c, c) for c in POLICY_CHOICES], label="Timed-out traces")
    tool_error = forms.ChoiceField(
        choices=[(c, c) for c in POLICY_CHOICES], label="Traces ending in a tool error"
    )
    failing_checks = forms.ChoiceField(
        choices=[(c, c) for c in POLICY_CHOICES], label="Approved targets failing their checks"
    )


@dataclass
class Cell:
    text: str
    url: str = ""


def _base_context(membership) -> dict:
    return {"membership": membership, "project": membership.project}


def _policy(project: Project) -> tuple[DataPolicy, str]:
    try:
        return data_policy_for(project), ""
    except ValueError as error:
        return DataPolicy(), f"The stored data policy is invalid ({error}); showing the defaults."


def _page_filters(request: HttpRequest, form: forms.Form) -> dict:
    """The page's trace filters as query values, for the evidence links."""
    names = [name for name in form.fields if name not in ("sort", "bucket")]
    return {name: request.GET.getlist(name) for name in names if request.GET.getlist(name)}


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _version_row(project: Project, group: GroupStats, filters: dict, policy: DataPolicy) -> list:
    def url(**extra) -> str:
        return evidence_url(project, filters, **group.version.trace_filters(), **extra)

    excluded = policy.excluded_terminations()
    return [
        Cell(group.version.label, url()),
        Cell(str(group.traces), url()),
        Cell(f"{_percent(group.tool_error_rate)} ({group.tool_errors}/{group.tool_results})"
             f" in {group.failing_traces} trace{'s' if group.failing_traces != 1 else ''}",
             url(tool_failure=TOOL_FAILED) if group.failing_traces else ""),
        Cell(_percent(group.tool_error_termination_rate), url(termination=Termination.TOOL_ERROR)),
        Cell(_percent(group.timeout_rate), url(termination=Termination.TIMEOUT)),
        Cell(_percent(group.truncated_rate), url(termination=Termination.TRUNCATED)),
        Cell(_percent(group.rate_of(excluded)) if excluded else "0% (keeps all)",
             url(termination=list(excluded)) if excluded else ""),
        Cell(_number(group.words_per_answer, 1), url()),
        Cell(f"{_percent(group.answered_at_once_rate)} "
             f"({group.answers_after_tool_error}/{group.tool_errors})",
             url(tool_failure=ANSWERED_ON_FAILURE) if group.answers_after_tool_error else ""),
        Cell(_number(group.completion_tokens, 0), url()),
        Cell(_number(group.tool_calls_per_trace), url(sort="most_tools")),
        Cell(f"{_percent(group.success_rate)} ({group.failed} failed)",
             url(outcome=FAILED_EPISODE) if group.failed else ""),
        Cell(_number(group.reward), url()),
        Cell(_percent(group.feedback_rate), url(feedback="yes")),
    ]  # fmt: skip


VERSION_COLUMNS = [
    "Version", "Traces", "Tool-call errors", "Ended in tool error", "Timeouts",
    "Cut at max_tokens", "Excluded by policy", "Words per answer",
    "Failed calls answered at once", "Completion tokens",
    "Tool calls / trace",
    "Success", "Reward", "With feedback",
]  # fmt: skip

CHARTS = [
    # (title, value of a group, shown as a percent)
    ("Tool-call error rate", lambda g: g.tool_error_rate, True),
    ("Timeout rate", lambda g: g.timeout_rate, True),
    ("Words per answer", lambda g: g.words_per_answer, False),
    (
        "Failed tool calls answered at once, without trying again",
        lambda g: g.answered_at_once_rate,
        True,
    ),
    ("Tool calls per trace", lambda g: g.tool_calls_per_trace, False),
    ("Success rate (timeouts and tool errors count as failures)", lambda g: g.success_rate, True),
    ("Share of traces with feedback", lambda g: g.feedback_rate, True),
]


def _charts(monitor: Monitor) -> list:
    buckets = monitor.buckets
    fmt = "%Y-%m-%d" if monitor.bucket == "day" else "%m-%d %H:00"
    x_labels = [bucket.strftime(fmt) for bucket in buckets]
    index = {bucket: i for i, bucket in enumerate(buckets)}
    charts = []
    for title, value_of, percent in CHARTS:
        series: dict[str, list] = {}
        for group in monitor.series:
            values = series.setdefault(group.version.label, [None] * len(buckets))
            values[index[group.bucket]] = value_of(group)
        charts.append(multi_line_chart(x_labels, series, label=title, percent=percent))
    rows = [(group.version.label, group.terminations) for group in monitor.versions]
    charts.append(
        stacked_bar_chart(rows, list(Termination.values), label="Terminations per version")
    )
    return charts


@dataclass
class ToolRow:
    version: str
    tool: str
    results: Cell  # linked to the traces that called the tool
    errors: Cell  # "N in M traces", linked to those M traces
    error_rate: str
    examples: list[tuple[int, str]]  # the newest failing traces: (id, trace page)


def _tool_rows(project: Project, monitor: Monitor, filters: dict) -> list[ToolRow]:
    rows = []
    for group in monitor.versions:
        for name, tool in sorted(group.tools.items()):
            examples = [
                (trace_id, reverse("trace_detail", args=[project.slug, trace_id]))
                for trace_id in tool.error_examples
            ]
            version = group.version.trace_filters()
            traces = tool.failing_traces
            errors = Cell(
                f"{tool.errors} in {traces} trace{'s' if traces != 1 else ''}",
                evidence_url(project, filters, **version, failed_tool=name) if traces else "",
            )
            results = Cell(
                str(tool.calls),
                evidence_url(project, filters, **version, called_tool=name) if tool.calls else "",
            )
            rows.append(
                ToolRow(
                    group.version.label,
                    name,
                    results,
                    errors,
                    _percent(tool.error_rate),
                    examples,
                )
            )
    return rows


@require_GET
@login_required
def monitors(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    project = membership.project
    if request.htmx and request.htmx.target == "nav-monitors":
        return _alert_count(request, project)
    form = MonitorForm(request.GET or None, project=project)
    valid = not form.is_bound or form.is_valid()
    filters = dict(form.cleaned_data) if form.is_bound and valid else {}
    if filters.get("bucket") == "hour" and not filters.get("since"):
        # Hours over a project's whole life would be thousands of points per line.
        filters["since"] = timezone.localdate() - timedelta(days=HOUR_BUCKET_DAYS - 1)
    monitor = compute_monitor(
        project=project, filters=filters, bucket=filters.get("bucket") or "day"
    )
    policy, policy_error = _policy(project)
    page_filters = _page_filters(request, form) if valid else {}
    if filters.get("since"):  # the implicit one of hourly buckets too
        page_filters["since"] = [filters["since"].isoformat()]
    context = {
        **_base_context(membership),
        "form": form,
        "monitor": monitor,
        "alerts": alerts_from_monitor(
            project=project, monitor=monitor, policy=policy, filters=page_filters
        ),
        "charts": _charts(monitor),
        "columns": VERSION_COLUMNS,
        "rows": [_version_row(project, g, page_filters, policy) for g in monitor.versions],
        "tool_rows": _tool_rows(project, monitor, page_filters),
        "policy": policy,
        "policy_error": policy_error,
        "since": filters.get("since"),
        "refusals": recent_refusals(project),
    }
    return render_page(
        request,
        "monitors/monitors.html",
        context,
        fragment="monitor-results",
        status=200 if valid else 422,
    )


def _alert_count(request: HttpRequest, project: Project) -> HttpResponse:
    """The nav link's text with the project's alert count; htmx loads it after any page."""
    key = f"monitors:alert-count:{project.pk}"
    count = cache.get(key)
    if count is None:
        count = len(project_alerts(project=project))
        cache.set(key, count, ALERT_COUNT_SECONDS)
    return render(request, "monitors/_alert_count.html", {"project": project, "count": count})


@login_required
def dataset(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    project = membership.project
    policy, policy_error = _policy(project)
    status = 200
    form = DataPolicyForm(initial=policy.model_dump())
    if request.method == "POST":
        membership = get_admin_membership_for_user(request.user, slug)
        form = DataPolicyForm(request.POST)
        if form.is_valid():
            set_data_policy(project=project, policy=DataPolicy(**form.cleaned_data))
            return redirect("dataset", slug=slug)
        status = 422
    training_set = build_training_set(project=project, policy=policy)
    monitor = compute_monitor(project=project, per_tool=False)
    excluded = policy.excluded_terminations()
    context = {
        **_base_context(membership),
        "form": form,
        "policy": policy,
        "policy_error": policy_error,
        "training_set": training_set,
        "exclusions": _exclusion_rows(project, training_set),
        "versions": [
            (
                group.version.label,
                group.traces,
                _percent(group.rate_of(excluded)),
                evidence_url(
                    project, {}, **group.version.trace_filters(), termination=list(excluded)
                )
                if excluded
                else "",
            )
            for group in monitor.versions
        ],
    }
    return render(request, "monitors/dataset.html", context, status=status)


# dataset.REASONS names the policy reasons as the policy excludes them; when it keeps them, the
# row says so instead of claiming an "exclude" policy the page contradicts.
POLICY_KEEP_LABELS = {
    "policy_timeout": ("timeout", "trace timed out (data policy: keep, none left out)"),
    "policy_tool_error": (
        "tool_error",
        "trace ended in a tool error (data policy: keep, none left out)",
    ),
}


def _exclusion_rows(project: Project, training_set) -> list[tuple[str, int, str]]:
    """(label, count, where to see them) per reason, labelled by the policy in force."""
    kept_labels = {
        reason: label
        for reason, (field, label) in POLICY_KEEP_LABELS.items()
        if getattr(training_set.policy, field) == "keep"
    }
    targets = reverse("target_list", args=[project.slug])
    where = {
        "feedback_without_targets": evidence_url(project, {}, feedback="yes"),
        "target_not_reviewed": f"{targets}?state={TargetState.PROPOSED}",
        "target_rejected": f"{targets}?state={TargetState.REJECTED}",
        "fails_checks": f"{targets}?state={TargetState.APPROVED}",
        "policy_timeout": evidence_url(project, {}, termination="timeout", feedback="yes"),
        "policy_tool_error": evidence_url(project, {}, termination="tool_error", feedback="yes"),
    }
    return [
        (kept_labels.get(reason, label), count, where.get(reason, ""))
        for reason, label, count in training_set.exclusion_rows()
    ]
