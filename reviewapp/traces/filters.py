"""The trace list's filters: one form, used by the list page and by queue building."""

import re
from dataclasses import dataclass
from datetime import datetime, time

from django import forms
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import QueryDict
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from reviewapp.projects.models import Project
from reviewapp.traces.models import FAILURE_TERMINATIONS, Tag, Termination, Trace, TraceTag

SORTS = {
    # name: (label, column, descending)
    "newest": ("Newest first", "id", True),
    "oldest": ("Oldest first", "id", False),
    "longest": ("Most messages", "message_count", True),
    "most_tools": ("Most tool calls", "tool_call_count", True),
}
# The "adapter" filter's value for traces the base model answered (no adapter version).
BASE_ADAPTER = "base"
# The "tool_failure" filter's values: whether any tool call of the trace returned an error,
# whatever the episode's termination (an agent may go on and complete after a failed lookup),
# and whether the agent answered straight after one (without the result it asked for).
TOOL_FAILED, NO_TOOL_FAILED, ANSWERED_ON_FAILURE = "yes", "no", "answered"
# The "outcome" filter's value for the episodes the monitors' success rate counts as failed.
FAILED_EPISODE = "failed"


class TraceFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Text")
    tag = forms.ModelMultipleChoiceField(
        queryset=Tag.objects.none(), required=False, to_field_name="name"
    )
    termination = forms.MultipleChoiceField(
        choices=Termination.choices, required=False, widget=forms.CheckboxSelectMultiple
    )
    tool_failure = forms.ChoiceField(
        choices=[
            ("", "any"),
            (TOOL_FAILED, "a tool call failed"),
            (ANSWERED_ON_FAILURE, "answered straight after a failed call"),
            (NO_TOOL_FAILED, "none failed"),
        ],
        required=False,
        label="Tool calls",
    )
    failed_tool = forms.CharField(
        required=False,
        max_length=200,
        label="Failed tool",
        help_text="A call of this tool (by name) returned an error.",
    )
    called_tool = forms.CharField(
        required=False,
        max_length=200,
        label="Called tool",
        help_text="A call of this tool (by name) returned a result.",
    )
    model = forms.CharField(required=False, max_length=200)
    adapter = forms.CharField(required=False, max_length=200, label="Adapter version")
    outcome = forms.ChoiceField(
        choices=[
            ("", "any"),
            ("success", "success"),
            ("failure", "failure"),
            ("none", "none"),
            # What the monitors count as failed: reported so, or a failure ending.
            (FAILED_EPISODE, "failed or a failure ending"),
        ],
        required=False,
    )
    feedback = forms.ChoiceField(
        choices=[("", "any"), ("yes", "has feedback"), ("no", "no feedback")], required=False
    )
    review = forms.ChoiceField(
        choices=[("", "any"), ("reviewed", "reviewed"), ("unreviewed", "not reviewed")],
        required=False,
    )
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    sort = forms.ChoiceField(
        choices=[(name, label) for name, (label, _, _) in SORTS.items()], required=False
    )

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tag"].queryset = Tag.objects.filter(project=project).order_by("name")


def filter_query(data: QueryDict) -> str:
    """The trace-list filters in `data` as a query string: filter fields only (no cursor, no
    other form's fields), blanks left out. A queue and a saved view keep their filters so."""
    query = QueryDict(mutable=True)
    for name in TraceFilterForm.base_fields:
        values = [value for value in data.getlist(name) if value]
        if values:
            query.setlist(name, values)
    return query.urlencode()


def _day_start(day) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def text_matches(text: str) -> Q:
    """Traces whose id, first user message, answers or tool errors contain the text.

    Served by trigram indexes on PostgreSQL (migrations 0005 and 0013); SQLite scans.
    """
    return (
        Q(external_id__icontains=text) | Q(preview__icontains=text) | Q(search_text__icontains=text)
    )


# About what one line of the list's text column holds: the match and the words around it.
SNIPPET_CHARS = 120


@dataclass(frozen=True)
class SearchMatch:
    html: SafeString  # the text around the match, escaped, the match in <mark>
    in_preview: bool  # found in the first user message (shown highlighted in its place)


def match_snippet(text: str, query: str) -> SafeString | None:
    """About SNIPPET_CHARS of `text` around the first case-insensitive occurrence of `query`,
    escaped, with the occurrence in <mark>; None when the text does not contain it."""
    found = re.search(re.escape(query), text, re.IGNORECASE)
    if found is None:
        return None
    start, end = found.span()
    room = max(SNIPPET_CHARS - (end - start), 0)
    # Half the room on each side; what one side cannot use (the text starts or ends) goes to
    # the other.
    before = max(start - room // 2, 0)
    after = min(end + room - (start - before), len(text))
    before = max(start - (room - (after - end)), 0)
    return format_html(
        "{}{}<mark>{}</mark>{}{}",
        "…" if before > 0 else "",
        _one_line(text[before:start]),
        _one_line(text[start:end]),
        _one_line(text[end:after]),
        "…" if after < len(text) else "",
    )


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def search_matches(traces: list[Trace], query: str) -> dict[int, SearchMatch]:
    """Where `query` matched in each of these traces (the rows of one page): in the text
    extracted at ingest (answers, tool calls, tool errors), else in the first user message.

    A trace found by its id alone has no entry. One query for the rows' extracted text.
    """
    extracted = dict(
        Trace.objects.filter(pk__in=[trace.pk for trace in traces]).values_list("pk", "search_text")
    )
    matches = {}
    for trace in traces:
        if snippet := match_snippet(extracted.get(trace.pk, ""), query):
            matches[trace.pk] = SearchMatch(snippet, in_preview=False)
        elif snippet := match_snippet(trace.preview, query):
            matches[trace.pk] = SearchMatch(snippet, in_preview=True)
    return matches


def filtered_traces(project: Project, filters: dict) -> QuerySet[Trace]:
    """Traces of a project matching cleaned TraceFilterForm data, in the chosen order."""
    traces = Trace.objects.filter(project=project)
    if filters.get("q"):
        traces = traces.filter(text_matches(filters["q"]))
    for tag in filters.get("tag") or ():  # all chosen tags, not any
        traces = traces.filter(Exists(TraceTag.objects.filter(trace=OuterRef("pk"), tag=tag)))
    if filters.get("termination"):
        traces = traces.filter(termination__in=filters["termination"])
    # The per-trace facts stored at ingest (reviewapp/traces/facts.py): the counts the
    # monitors sum, so a figure there and the traces its link opens agree.
    if filters.get("tool_failure") == TOOL_FAILED:
        traces = traces.filter(tool_error_count__gt=0)
    elif filters.get("tool_failure") == NO_TOOL_FAILED:
        traces = traces.filter(tool_error_count=0)
    elif filters.get("tool_failure") == ANSWERED_ON_FAILURE:
        traces = traces.filter(answers_after_tool_error__gt=0)
    if filters.get("failed_tool"):
        traces = traces.filter(tool_error_count__gt=0, tool_errors__has_key=filters["failed_tool"])
    if filters.get("called_tool"):
        traces = traces.filter(
            tool_result_count__gt=0, tool_results__has_key=filters["called_tool"]
        )
    if filters.get("model"):
        traces = traces.filter(model=filters["model"])
    if filters.get("adapter") == BASE_ADAPTER:
        traces = traces.filter(adapter_version="")
    elif filters.get("adapter"):
        traces = traces.filter(adapter_version=filters["adapter"])
    outcome = filters.get("outcome")
    if outcome == "success":
        traces = traces.filter(success=True)
    elif outcome == "failure":
        traces = traces.filter(success=False)
    elif outcome == "none":
        traces = traces.filter(success__isnull=True)
    elif outcome == FAILED_EPISODE:
        traces = traces.filter(Q(success=False) | Q(termination__in=FAILURE_TERMINATIONS))
    # review's Feedback, reached through the relation it declares on a trace (search sits below
    # review): the same EXISTS on feedback(trace_id) as before, with no join back to the trace.
    feedback = Trace._meta.get_field("feedback").related_model
    has_feedback = Exists(feedback.objects.filter(trace=OuterRef("pk")))
    if filters.get("feedback") == "yes":
        traces = traces.filter(has_feedback)
    elif filters.get("feedback") == "no":
        traces = traces.exclude(has_feedback)
    reviewed = has_feedback | Exists(
        TraceTag.objects.filter(trace=OuterRef("pk"), reviewer__isnull=False)
    )
    if filters.get("review") == "reviewed":
        traces = traces.filter(reviewed)
    elif filters.get("review") == "unreviewed":
        traces = traces.exclude(reviewed)
    if filters.get("since"):
        traces = traces.filter(received_at__gte=_day_start(filters["since"]))
    if filters.get("until"):
        traces = traces.filter(
            received_at__lt=_day_start(filters["until"]) + timezone.timedelta(days=1)
        )
    _, column, descending = SORTS[filters.get("sort") or "newest"]
    if column == "id":
        return traces.order_by("-id" if descending else "id")
    return traces.order_by(f"-{column}" if descending else column, "-id")


def after_cursor(traces: QuerySet[Trace], sort: str, cursor: str) -> QuerySet[Trace]:
    """Keyset pagination: rows after the last one shown; `cursor` is '<value>.<id>' or '<id>'."""
    _, column, descending = SORTS[sort or "newest"]
    try:
        if column == "id":
            last_id = int(cursor)
            return traces.filter(id__lt=last_id) if descending else traces.filter(id__gt=last_id)
        value_text, id_text = cursor.split(".", 1)
        value, last_id = int(value_text), int(id_text)
    except ValueError:
        return traces.none()
    if descending:
        return traces.filter(
            Q(**{f"{column}__lt": value}) | Q(**{column: value, "id__lt": last_id})
        )
    return traces.filter(Q(**{f"{column}__gt": value}) | Q(**{column: value, "id__lt": last_id}))


def cursor_for(trace: Trace, sort: str) -> str:
    _, column, _ = SORTS[sort or "newest"]
    if column == "id":
        return str(trace.id)
    return f"{getattr(trace, column)}.{trace.id}"
