"""Triage rules: route the traces matching a rule to its queue, a deterministic sample of them.

A rule looks at each trace once (a TriageMatch row records it), so running it again, or on a
trace delivered twice, adds nothing; a trace is never in a queue twice (QueueItem is unique).
Column conditions are one query; tool failures and text need the body, read in chunks.
"""

import hashlib
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet

from messages.text import content_text
from reviewapp.monitors.models import TriageMatch, TriageRule
from reviewapp.projects.models import Project
from reviewapp.review.models import Queue, QueueItem
from reviewapp.traces.models import Trace, TraceOutcome, TraceTag
from reviewapp.traces.rendering import looks_like_tool_error

# Bodies decompressed at a time when a rule needs them.
CHUNK = 500
ANY_TOOL = "*"


@dataclass(frozen=True)
class RouteResult:
    matched: int  # traces newly matched by the rule
    routed: int  # of those, the ones the sample sent to the queue


def in_sample(*, rule_id: int, trace_id: int, rate: float) -> bool:
    """Whether a matching trace is routed: a hash of (rule, trace), so every run agrees."""
    digest = hashlib.sha256(f"triage:{rule_id}:{trace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def _column_conditions(rule: TriageRule, traces: QuerySet[Trace]) -> QuerySet[Trace]:
    if rule.termination:
        traces = traces.filter(termination=rule.termination)
    if rule.min_tool_calls is not None:
        traces = traces.filter(tool_call_count__gt=rule.min_tool_calls)
    if rule.tag_id:
        tagged = TraceTag.objects.filter(trace=OuterRef("pk"), tag=rule.tag_id)
        traces = traces.filter(Exists(tagged))
    if rule.model:
        traces = traces.filter(model=rule.model)
    if rule.adapter_version:
        traces = traces.filter(adapter_version=rule.adapter_version)
    if rule.outcome == TraceOutcome.SUCCESS:
        traces = traces.filter(success=True)
    elif rule.outcome == TraceOutcome.FAILURE:
        traces = traces.filter(success=False)
    elif rule.outcome == TraceOutcome.NONE:
        traces = traces.filter(success__isnull=True)
    return traces


def failed_tools(messages: list[dict]) -> set[str]:
    """Names of the tools whose result in this trace reads as an error."""
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            names[call.get("id")] = (call.get("function") or {}).get("name", "")
    return {
        names.get(message.get("tool_call_id"), "")
        for message in messages
        if message.get("role") == "tool"
        and looks_like_tool_error(content_text(message.get("content")))
    }


def body_matches(rule: TriageRule, messages: list[dict]) -> bool:
    """The conditions that read the messages: a failed tool, a text."""
    if rule.failed_tool:
        failed = failed_tools(messages)
        if not failed or (rule.failed_tool != ANY_TOOL and rule.failed_tool not in failed):
            return False
    if rule.text:
        needle = rule.text.casefold()
        if not any(needle in content_text(m.get("content")).casefold() for m in messages):
            return False
    return True


def _append_to_queue(queue: Queue, trace_ids: list[int]) -> None:
    if not trace_ids:
        return
    # The queue row lock orders concurrent appends, so positions stay in arrival order.
    Queue.objects.select_for_update().filter(pk=queue.pk).first()
    last = QueueItem.objects.filter(queue=queue).aggregate(last=Max("position"))["last"] or 0
    QueueItem.objects.bulk_create(
        [
            QueueItem(queue=queue, trace_id=trace_id, position=position)
            for position, trace_id in enumerate(trace_ids, start=last + 1)
        ],
        ignore_conflicts=True,  # already in the queue (by hand or another rule): stays once
    )


@transaction.atomic
def route_traces(*, rule: TriageRule, trace_ids: list[int] | None = None) -> RouteResult:
    """Apply the rule to these traces of its project (None: all of them) not seen by it yet."""
    candidates = _column_conditions(rule, Trace.objects.filter(project=rule.project)).exclude(
        Exists(TriageMatch.objects.filter(rule=rule, trace=OuterRef("pk")))
    )
    if trace_ids is not None:
        candidates = candidates.filter(pk__in=trace_ids)
    matched_ids: list[int] = []
    if rule.failed_tool or rule.text:
        ids = list(candidates.order_by("id").values_list("id", flat=True))
        for start in range(0, len(ids), CHUNK):
            for trace in Trace.objects.filter(pk__in=ids[start : start + CHUNK]).only(
                "body", "recording"
            ):
                if body_matches(rule, trace.body_json()["messages"]):
                    matched_ids.append(trace.pk)
        matched_ids.sort()
    else:
        matched_ids = list(candidates.order_by("id").values_list("id", flat=True))
    matches = [
        TriageMatch(
            rule=rule,
            trace_id=trace_id,
            routed=in_sample(rule_id=rule.pk, trace_id=trace_id, rate=rule.sample_rate),
        )
        for trace_id in matched_ids
    ]
    TriageMatch.objects.bulk_create(matches, ignore_conflicts=True, batch_size=1000)
    routed = [match.trace_id for match in matches if match.routed]
    _append_to_queue(rule.queue, routed)
    return RouteResult(matched=len(matches), routed=len(routed))


def triage_new_traces(*, trace_ids: list[int]) -> int:
    """Run every enabled rule of their projects on traces that just arrived or changed."""
    routed = 0
    projects = Trace.objects.filter(pk__in=trace_ids).values_list("project_id", flat=True)
    rules = TriageRule.objects.filter(project__in=projects.distinct(), enabled=True)
    for rule in rules.select_related("queue", "project").order_by("id"):
        routed += route_traces(rule=rule, trace_ids=trace_ids).routed
    return routed


@transaction.atomic
def save_rule(
    *, rule: TriageRule, new_queue_name: str = "", author=None, conditions_changed: bool = False
) -> TriageRule:
    """Store a rule built by the form; a new queue name makes an empty queue for it.

    When an existing rule's conditions or sample rate change, it forgets what it matched, so
    its counts and its next run follow the new conditions; what it queued stays queued.
    """
    if new_queue_name:
        rule.queue = Queue.objects.create(
            project=rule.project, name=new_queue_name, created_by=author
        )
    if rule.pk is None:
        rule.created_by = author
    elif conditions_changed:
        TriageMatch.objects.filter(rule=rule).delete()
    rule.save()
    return rule


def rules_with_counts(project: Project) -> QuerySet[TriageRule]:
    """The project's rules with `matched_count` and `routed_count`."""
    return (
        TriageRule.objects.filter(project=project)
        .select_related("queue", "tag")
        .annotate(
            matched_count=Count("matches"),
            routed_count=Count("matches", filter=Q(matches__routed=True)),
        )
        .order_by("name", "id")
    )
