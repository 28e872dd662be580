"""A trace's page: the conversation with its tool calls and gateway calls, and the reviewer's
actions on it (tags, feedback pinned to a turn, corrections), with what learning made of each
feedback."""

import json
from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event

from reviewapp.learning.lineage import adapters_by_feedback
from reviewapp.projects.access import (
    first_or_404,
    get_admin_membership_for_user,
    get_membership_for_user,
    get_reviewer_membership_for_user,
)
from reviewapp.projects.models import Membership
from reviewapp.review.feedback import (
    UNDO_SECONDS,
    FeedbackError,
    correct_feedback,
    delete_feedback_with_undo,
    record_feedback,
    retry_feedback,
    undo_feedback_delete,
)
from reviewapp.review.forms import (
    FeedbackForm,
)
from reviewapp.review.models import CopiedFeedback, DeletedFeedback, Feedback
from reviewapp.review.queues import blinds_reviewer
from reviewapp.review.tags import restore_tag, toggle_tag
from reviewapp.review.views.queues import queue_context
from reviewapp.traces.access import (
    get_trace_for_membership,
)
from reviewapp.traces.models import Tag, Termination, Trace, TraceTag
from reviewapp.traces.rendering import conversation, tool_definitions

# Sent with a changed feedback panel: the trace page's "more like this" reloads, so its
# apply-feedback form lists the trace's feedback as it is now.
REVIEW_CHANGED = "review-changed"
# The first messages render with the page; the rest arrive in chunks as the reader scrolls.
MESSAGES_PER_CHUNK = 200
# The trace page's table of gateway calls: what each call returned, never its bodies.
CALL_FIELDS = (
    "turn_index",
    "status_code",
    "finish_reason",
    "termination",
    "error",
    "latency_ms",
    "completion_tokens",
)
MAX_CALLS_SHOWN = 500
# Signs the "Undo" of a tag taken off a trace: which tag, whose, and since when it was on.
TAG_UNDO_SALT = "trace-tag-undo"


def _get_trace_for_reviewer(user, slug: str, trace_id: int) -> tuple[Membership, Trace]:
    membership = get_reviewer_membership_for_user(user, slug)
    return membership, get_trace_for_membership(membership, trace_id)


def _feedback_panel_context(request: HttpRequest, membership, trace) -> dict:
    """What the feedback panel re-renders with after an action on one of its feedback."""
    return {
        **_review_context(request, membership, trace),
        "feedback_form": FeedbackForm(turns=conversation(trace.body_json()["messages"])),
    }


def _feedback_panel_after(
    request: HttpRequest,
    membership,
    trace,
    *,
    anchor: str = "feedback-panel",
    changed: bool = True,
    notes: dict | None = None,
) -> HttpResponse:
    """After an action on the trace's feedback: htmx re-renders the panel (and, when the
    feedback changed, tells "more like this" to reload); a plain form post goes back to the
    trace page at `anchor`. `notes` are what the panel says about the action: the feedback
    just saved, a delete to undo, why an undo failed."""
    if not request.htmx:
        page = reverse("trace_detail", args=[membership.project.slug, trace.pk])
        return redirect(f"{page}#{anchor}")
    context = {**_feedback_panel_context(request, membership, trace), **(notes or {})}
    response = render(request, "workbench/trace_page.html#feedback-panel", context)
    return trigger_client_event(response, REVIEW_CHANGED) if changed else response


def _feedback_panel_saved(request: HttpRequest, membership, trace, saved) -> HttpResponse:
    """After a feedback is saved or put back: the panel says so, and a plain post lands on it."""
    return _feedback_panel_after(
        request, membership, trace, anchor=f"feedback-{saved.pk}", notes={"saved": saved}
    )


def _review_context(request: HttpRequest, membership, trace) -> dict:
    my_tag_ids = set(
        TraceTag.objects.filter(trace=trace, reviewer=request.user).values_list("tag_id", flat=True)
    )
    all_tags = list(
        TraceTag.objects.filter(trace=trace).select_related("tag", "reviewer").order_by("tag__name")
    )
    feedback_list = list(trace.feedback.select_related("reviewer", "api_key").order_by("id"))
    learned_by = adapters_by_feedback([feedback.pk for feedback in feedback_list])
    copied_from = _copied_from([feedback.pk for feedback in feedback_list])
    for feedback in feedback_list:
        feedback.learned_by = learned_by.get(feedback.pk, [])
        feedback.copy_source = copied_from.get(feedback.pk)
    return {
        "membership": membership,
        "project": membership.project,
        "trace": trace,
        "tags": list(Tag.objects.filter(project=membership.project).order_by("name")[: 9 * 4]),
        "my_tag_ids": my_tag_ids,
        "all_trace_tags": all_tags,
        "feedback_list": feedback_list,
        # Blind queues: nobody else's work shows until this reviewer has finished the item.
        "hide_others": blinds_reviewer(trace=trace, reviewer=request.user),
    }


def _copied_from(feedback_ids: list[int]) -> dict[int, dict]:
    """For each feedback "apply to similar" copied here: the trace it came from and how alike
    the two were (source_trace None once the original was deleted)."""
    rows = CopiedFeedback.objects.filter(feedback_id__in=feedback_ids).values(
        "feedback_id", "similarity", "source_id", "source__trace_id", "source__trace__external_id"
    )
    return {
        row["feedback_id"]: {
            "feedback_id": row["source_id"],
            "trace_id": row["source__trace_id"],
            "external_id": row["source__trace__external_id"],
            "similarity": row["similarity"],
        }
        for row in rows
    }


@require_GET
@login_required
def trace_detail(request: HttpRequest, slug: str, trace_id: int) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    trace = get_trace_for_membership(membership, trace_id)
    body = trace.body_json()
    messages = body["messages"]
    start = max(int(request.GET.get("start", 0) or 0), 0)
    turns = conversation(messages)
    chunk = turns[start : start + MESSAGES_PER_CHUNK]
    more_from = start + MESSAGES_PER_CHUNK if start + MESSAGES_PER_CHUNK < len(turns) else None
    calls = list(trace.calls.order_by("id").only(*CALL_FIELDS)[:MAX_CALLS_SHOWN])
    context = {
        **_review_context(request, membership, trace),
        "turns": chunk,
        "more_from": more_from,
        "tools": tool_definitions(body["tools"], messages),
        "metadata_json": json.dumps(trace.metadata, indent=2, ensure_ascii=False),
        "duration_s": (
            (trace.ended_at - trace.started_at).total_seconds()
            if trace.started_at and trace.ended_at
            else None
        ),
        "feedback_form": FeedbackForm(turns=turns),
        "calls": calls,
        "cut_turns": _cut_turns(trace, turns),
        # The last call that failed says why an error trace ended: status and message.
        "failed_call": next(
            (call for call in reversed(calls) if call.error or (call.status_code or 0) >= 400),
            None,
        ),
        **queue_context(request, membership, trace),  # opened from a queue: ?queue=&item=
    }
    if request.htmx and start:
        return render(request, "workbench/trace_page.html#turn-chunk", context)
    return render(request, "workbench/trace_page.html", context)


def _cut_turns(trace, turns) -> set[int]:
    """Indexes of the assistant turns cut at max_tokens: the recorded calls say which; a pushed
    trace that ended truncated has no calls, and its last assistant turn is the one cut."""
    cut = set(
        trace.calls.filter(finish_reason="length", turn_index__isnull=False).values_list(
            "turn_index", flat=True
        )
    )
    if not cut and trace.termination == Termination.TRUNCATED:
        assistant_turns = [turn.index for turn in turns if turn.role == "assistant"]
        cut = set(assistant_turns[-1:])
    return cut


@require_POST
@login_required
def trace_toggle_tag(request: HttpRequest, slug: str, trace_id: int, tag_id: int) -> HttpResponse:
    membership, trace = _get_trace_for_reviewer(request.user, slug, trace_id)
    tag = Tag.objects.filter(project=membership.project, pk=tag_id).first()
    if tag is None:
        return HttpResponse("no such tag", status=404)
    was_on = TraceTag.objects.filter(trace=trace, tag=tag, reviewer=request.user).first()
    toggle_tag(trace=trace, tag=tag, reviewer=request.user)
    if not request.htmx:
        return redirect("trace_detail", slug=slug, trace_id=trace.pk)
    context = _review_context(request, membership, trace)
    if was_on is not None:  # taken off: the panel offers to put it back as it was
        context["untagged"] = tag
        context["tag_undo_token"] = signing.dumps(
            {
                "tag": tag.pk,
                "reviewer": request.user.pk,
                "created_at": was_on.created_at.isoformat(),
            },
            salt=f"{TAG_UNDO_SALT}:{trace.pk}",
        )
    return render(request, "workbench/trace_page.html#review-tags", context)


@require_POST
@login_required
def trace_undo_untag(request: HttpRequest, slug: str, trace_id: int) -> HttpResponse:
    """Put back the tag the reviewer just took off, with the time it was first put on."""
    membership, trace = _get_trace_for_reviewer(request.user, slug, trace_id)
    try:
        undo = signing.loads(
            request.POST.get("token", ""), salt=f"{TAG_UNDO_SALT}:{trace.pk}", max_age=UNDO_SECONDS
        )
    except signing.BadSignature:  # expired, forged, or for another trace
        return HttpResponse("nothing to undo", status=400)
    tag = Tag.objects.filter(project=membership.project, pk=undo["tag"]).first()
    if tag is None or undo["reviewer"] != request.user.pk:
        return HttpResponse("nothing to undo", status=400)
    restore_tag(
        trace=trace,
        tag=tag,
        reviewer=request.user,
        created_at=datetime.fromisoformat(undo["created_at"]),
    )
    if request.htmx:
        return render(
            request,
            "workbench/trace_page.html#review-tags",
            _review_context(request, membership, trace),
        )
    return redirect("trace_detail", slug=slug, trace_id=trace.pk)


@require_POST
@login_required
def trace_add_feedback(request: HttpRequest, slug: str, trace_id: int) -> HttpResponse:
    membership, trace = _get_trace_for_reviewer(request.user, slug, trace_id)
    body = trace.body_json()
    form = FeedbackForm(request.POST, turns=conversation(body["messages"]))
    if form.is_valid():
        try:
            saved, _ = record_feedback(
                trace=trace,
                reviewer=request.user,
                author=request.user.get_username(),
                **form.feedback_kwargs(),
            )
        except FeedbackError as error:
            form.add_error(None, str(error))
    if form.errors:
        context = {**_review_context(request, membership, trace), "feedback_form": form}
        return render(request, "workbench/trace_page.html#feedback-panel", context, status=422)
    return _feedback_panel_saved(request, membership, trace, saved)


@require_POST
@login_required
def feedback_delete(
    request: HttpRequest, slug: str, trace_id: int, feedback_id: int
) -> HttpResponse:
    membership, trace = _get_trace_for_reviewer(request.user, slug, trace_id)
    feedback = Feedback.objects.filter(trace=trace, pk=feedback_id, reviewer=request.user).first()
    deleted = None
    if feedback is not None:  # someone else's feedback is not theirs to delete: nothing happens
        deleted = delete_feedback_with_undo(feedback=feedback, deleted_by=request.user)
    return _feedback_panel_after(request, membership, trace, notes={"deleted": deleted})


@require_POST
@login_required
def feedback_undo_delete(
    request: HttpRequest, slug: str, trace_id: int, deleted_id: int
) -> HttpResponse:
    """Put back a feedback the reviewer deleted a moment ago, exactly as it was."""
    membership, trace = _get_trace_for_reviewer(request.user, slug, trace_id)
    # Another reviewer's delete, or one already undone, is not there to undo.
    deleted = first_or_404(
        DeletedFeedback.objects.filter(trace=trace, pk=deleted_id, deleted_by=request.user),
        "nothing to undo",
    )
    try:
        feedback = undo_feedback_delete(deleted=deleted)
    except FeedbackError as error:
        return _feedback_panel_after(request, membership, trace, notes={"undo_error": str(error)})
    return _feedback_panel_saved(request, membership, trace, feedback)


@require_POST
@login_required
def feedback_retry(
    request: HttpRequest, slug: str, trace_id: int, feedback_id: int
) -> HttpResponse:
    """An admin asks again for targets from a feedback the model could not use."""
    membership = get_admin_membership_for_user(request.user, slug)
    trace = get_trace_for_membership(membership, trace_id)
    feedback = Feedback.objects.filter(trace=trace, pk=feedback_id).first()
    if feedback is not None:
        retry_feedback(feedback=feedback)  # one still too long stays failed, its reason shown
    return _feedback_panel_after(
        request, membership, trace, anchor=f"feedback-{feedback_id}", changed=False
    )


@require_POST
@login_required
def feedback_correct(
    request: HttpRequest, slug: str, trace_id: int, feedback_id: int
) -> HttpResponse:
    """A reviewer writes the corrected turn for a feedback nothing usable came out of."""
    membership, trace = _get_trace_for_reviewer(request.user, slug, trace_id)
    feedback = first_or_404(
        Feedback.objects.filter(trace=trace, pk=feedback_id), "no such feedback"
    )
    error, status = "", 200
    try:
        correct_feedback(feedback=feedback, correction_text=request.POST.get("correction", ""))
    except FeedbackError as problem:
        error, status = str(problem), 422
    if not request.htmx and not error:
        return redirect(reverse("trace_detail", args=[slug, trace.pk]) + f"#feedback-{feedback_id}")
    context = {
        **_feedback_panel_context(request, membership, trace),
        "correction_error": error,
        "correction_error_for": feedback.pk,
    }
    response = render(request, "workbench/trace_page.html#feedback-panel", context, status=status)
    return trigger_client_event(response, REVIEW_CHANGED) if not error else response
