"""Reads the learning loop makes: what is approved, which traces went well, tags per trace."""

from django.db.models import Q, QuerySet

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.projects.models import Project
from reviewapp.traces.models import Trace, TraceTag, tools_shown

# Recent traces that went well, for the forgetting guard and the gate's drift check.
GOOD_TRACES = 8


def approved_targets(project: Project) -> QuerySet[DistillationTarget]:
    return DistillationTarget.objects.filter(
        feedback__trace__project=project,
        state__in=(TargetState.APPROVED, TargetState.EDITED),
    ).select_related("feedback")


def good_trace_ids(project: Project, *, exclude_trace_ids: set[int]) -> list[int]:
    """Recent traces that went well (succeeded with no complaint, or a reviewer rated them up)
    and end in a text answer: the adapter should still give that answer."""
    good = (
        Trace.objects.filter(project=project)
        .filter(Q(success=True, feedback__isnull=True) | Q(feedback__rating__gt=0))
        .exclude(feedback__rating__lte=0)
        .exclude(pk__in=exclude_trace_ids)
        .distinct()
        .order_by("-id")
    )
    ids = []
    for trace in good[: GOOD_TRACES * 2].iterator():
        if final_answer(trace) is not None:
            ids.append(trace.pk)
        if len(ids) == GOOD_TRACES:
            break
    return ids


def final_answer(trace: Trace) -> tuple[list[dict], dict, list[dict] | None] | None:
    """(context, the last assistant text answer, tools) of a trace, or None if it has none."""
    body = trace.body_json()
    messages = body["messages"]
    for turn in range(len(messages) - 1, -1, -1):
        message = messages[turn]
        if (
            message["role"] == "assistant"
            and message.get("content")
            and not message.get("tool_calls")
        ):
            return messages[:turn], message, tools_shown(body, turn)
    return None


def tags_by_trace(trace_ids: set[int]) -> dict[int, list[str]]:
    tags: dict[int, list[str]] = {}
    for trace_id, tag_name in TraceTag.objects.filter(trace_id__in=trace_ids).values_list(
        "trace_id", "tag__name"
    ):
        tags.setdefault(trace_id, []).append(tag_name)
    return tags
