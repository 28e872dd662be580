"""The trace list's bulk actions: a tag, a queue or one feedback for every ticked trace, each
in one transaction. A failed one shows the list again with its error and the ticks kept."""

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from reviewapp.projects.access import (
    get_admin_membership_for_user,
    get_reviewer_membership_for_user,
)
from reviewapp.review.feedback import FeedbackError, record_feedback_on_traces
from reviewapp.review.forms import (
    BulkActionForm,
    BulkFeedbackForm,
    BulkQueueForm,
    BulkTagForm,
)
from reviewapp.review.queues import QueueError, add_traces_to_queue
from reviewapp.review.tags import tag_traces
from reviewapp.traces.access import get_traces_for_membership
from reviewapp.traces.models import Trace
from reviewapp.workbench.trace_list import render_trace_list, trace_list_url


@dataclass(frozen=True)
class _Action:
    form_class: type[BulkActionForm]
    # Does it to every ticked trace in one transaction; returns how many it changed.
    act: Callable[[HttpRequest, dict, list[Trace]], int]
    done: str  # what was done, formatted with `traces` and the form's cleaned data
    unchanged: str  # why a trace was left as it was
    admin: bool = False  # admins only (else reviewers)


def _bulk_action(request: HttpRequest, slug: str, action: _Action) -> HttpResponse:
    """Who acts on the traces they ticked (one of another project is a 404), the action, and
    back to the list as it was filtered, saying what was done. A refusal, of the form or of the
    service, shows the list again with its error and the ticks kept."""
    if action.admin:
        membership = get_admin_membership_for_user(request.user, slug)
    else:
        membership = get_reviewer_membership_for_user(request.user, slug)
    traces = get_traces_for_membership(membership, request.POST.getlist("trace"))
    form = action.form_class(request.POST, project=membership.project, traces=traces)
    if form.is_valid():
        try:
            changed = action.act(request, form.cleaned_data, traces)
        except (QueueError, FeedbackError) as error:
            form.add_error(None, str(error))
    if form.errors:
        filters = QueryDict(request.POST.get("filters", ""))
        return render_trace_list(request, membership, filters, bulk_form=form, status=422)
    count = len(traces)
    summary = action.done.format(traces=f"{count} trace{'s' * (count != 1)}", **form.cleaned_data)
    if changed < count:
        summary += f" ({count - changed} {action.unchanged})"
    messages.success(request, summary + ".")
    return redirect(trace_list_url(membership.project, request.POST.get("filters", "")))


TAG = _Action(
    BulkTagForm,
    lambda request, data, traces: tag_traces(traces=traces, tag=data["tag"], reviewer=request.user),
    done="Tagged {traces} “{tag.name}”",
    unchanged="had it from you already",
)
# Admins manage queues (the role model); reviewers work them.
QUEUE = _Action(
    BulkQueueForm,
    lambda request, data, traces: add_traces_to_queue(queue=data["queue"], traces=traces),
    done="Put {traces} in the queue “{queue.name}”",
    unchanged="were in it already and kept their place",
    admin=True,
)
FEEDBACK = _Action(
    BulkFeedbackForm,
    lambda request, data, traces: record_feedback_on_traces(
        traces=traces, text=data["text"], reviewer=request.user
    ),
    done="Wrote the feedback on {traces}",
    unchanged="had the same feedback from you already",
)


@require_POST
@login_required
def traces_bulk_tag(request: HttpRequest, slug: str) -> HttpResponse:
    return _bulk_action(request, slug, TAG)


@require_POST
@login_required
def traces_bulk_queue(request: HttpRequest, slug: str) -> HttpResponse:
    return _bulk_action(request, slug, QUEUE)


@require_POST
@login_required
def traces_bulk_feedback(request: HttpRequest, slug: str) -> HttpResponse:
    return _bulk_action(request, slug, FEEDBACK)
