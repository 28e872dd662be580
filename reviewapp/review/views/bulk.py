"""The trace list's bulk actions: a tag, a queue or one feedback for every ticked trace, each
in one transaction. A failed one shows the list again with its error and the ticks kept."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from reviewapp.projects.access import (
    get_admin_membership_for_user,
    get_reviewer_membership_for_user,
)
from reviewapp.projects.models import Membership
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
from reviewapp.traces.views import render_trace_list, trace_list_url


def _get_ticked_traces_for_user(
    user, slug: str, data: QueryDict, *, admin: bool = False
) -> tuple[Membership, list[Trace]]:
    """Who acts (a reviewer, or an admin where `admin`) and the traces they ticked; one of
    another project is a 404."""
    if admin:
        membership = get_admin_membership_for_user(user, slug)
    else:
        membership = get_reviewer_membership_for_user(user, slug)
    return membership, get_traces_for_membership(membership, data.getlist("trace"))


def _refused(request: HttpRequest, membership: Membership, form: BulkActionForm) -> HttpResponse:
    filters = QueryDict(request.POST.get("filters", ""))
    return render_trace_list(request, membership, filters, bulk_form=form, status=422)


def _done(request: HttpRequest, membership: Membership, summary: str) -> HttpResponse:
    """Back to the list as it was filtered, saying what was done."""
    messages.success(request, summary)
    return redirect(trace_list_url(membership.project, request.POST.get("filters", "")))


def _traces(count: int) -> str:
    return f"{count} trace{'s' * (count != 1)}"


@require_POST
@login_required
def traces_bulk_tag(request: HttpRequest, slug: str) -> HttpResponse:
    membership, traces = _get_ticked_traces_for_user(request.user, slug, request.POST)
    form = BulkTagForm(request.POST, project=membership.project, traces=traces)
    if not form.is_valid():
        return _refused(request, membership, form)
    tag = form.cleaned_data["tag"]
    added = tag_traces(traces=traces, tag=tag, reviewer=request.user)
    summary = f"Tagged {_traces(len(traces))} “{tag.name}”"
    if added < len(traces):
        summary += f" ({len(traces) - added} had it from you already)"
    return _done(request, membership, summary + ".")


@require_POST
@login_required
def traces_bulk_queue(request: HttpRequest, slug: str) -> HttpResponse:
    # Admins manage queues (the role model); reviewers work them.
    membership, traces = _get_ticked_traces_for_user(request.user, slug, request.POST, admin=True)
    form = BulkQueueForm(request.POST, project=membership.project, traces=traces)
    if form.is_valid():
        queue = form.cleaned_data["queue"]
        try:
            added = add_traces_to_queue(queue=queue, traces=traces)
        except QueueError as error:
            form.add_error(None, str(error))
    if form.errors:
        return _refused(request, membership, form)
    summary = f"Put {_traces(len(traces))} in the queue “{queue.name}”"
    if added < len(traces):
        summary += f" ({len(traces) - added} were in it already and kept their place)"
    return _done(request, membership, summary + ".")


@require_POST
@login_required
def traces_bulk_feedback(request: HttpRequest, slug: str) -> HttpResponse:
    membership, traces = _get_ticked_traces_for_user(request.user, slug, request.POST)
    form = BulkFeedbackForm(request.POST, project=membership.project, traces=traces)
    if form.is_valid():
        try:
            written = record_feedback_on_traces(
                traces=traces, text=form.cleaned_data["text"], reviewer=request.user
            )
        except FeedbackError as error:
            form.add_error(None, str(error))
    if form.errors:
        return _refused(request, membership, form)
    summary = f"Wrote the feedback on {_traces(len(traces))}"
    if written < len(traces):
        summary += f" ({len(traces) - written} had the same feedback from you already)"
    return _done(request, membership, summary + ".")
