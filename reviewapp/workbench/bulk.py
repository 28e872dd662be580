"""The trace list's bulk actions: a tag, a queue or one feedback for every ticked trace, each
in one transaction. A failed one shows the list again with its error and the ticks kept."""

from collections.abc import Callable

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


def _bulk_action(
    request: HttpRequest,
    slug: str,
    form_class: type[BulkActionForm],
    act: Callable[[dict, list[Trace]], str],
    *,
    admin: bool = False,
) -> HttpResponse:
    """Who acts (a reviewer, or an admin where `admin`) on the traces they ticked (one of another
    project is a 404); `act` does it in one transaction and says what was done. A refusal, of
    the form or of the service, shows the list again with its error and the ticks kept."""
    if admin:
        membership = get_admin_membership_for_user(request.user, slug)
    else:
        membership = get_reviewer_membership_for_user(request.user, slug)
    traces = get_traces_for_membership(membership, request.POST.getlist("trace"))
    form = form_class(request.POST, project=membership.project, traces=traces)
    if form.is_valid():
        try:
            summary = act(form.cleaned_data, traces)
        except (QueueError, FeedbackError) as error:
            form.add_error(None, str(error))
    if form.errors:
        filters = QueryDict(request.POST.get("filters", ""))
        return render_trace_list(request, membership, filters, bulk_form=form, status=422)
    messages.success(request, summary)
    # Back to the list as it was filtered.
    return redirect(trace_list_url(membership.project, request.POST.get("filters", "")))


def _traces(count: int) -> str:
    return f"{count} trace{'s' * (count != 1)}"


def _unchanged(done: int, traces: list[Trace], why: str) -> str:
    return f" ({len(traces) - done} {why})" if done < len(traces) else ""


@require_POST
@login_required
def traces_bulk_tag(request: HttpRequest, slug: str) -> HttpResponse:
    def tag(data: dict, traces: list[Trace]) -> str:
        added = tag_traces(traces=traces, tag=data["tag"], reviewer=request.user)
        return (
            f"Tagged {_traces(len(traces))} “{data['tag'].name}”"
            f"{_unchanged(added, traces, 'had it from you already')}."
        )

    return _bulk_action(request, slug, BulkTagForm, tag)


@require_POST
@login_required
def traces_bulk_queue(request: HttpRequest, slug: str) -> HttpResponse:
    def enqueue(data: dict, traces: list[Trace]) -> str:
        added = add_traces_to_queue(queue=data["queue"], traces=traces)
        return (
            f"Put {_traces(len(traces))} in the queue “{data['queue'].name}”"
            f"{_unchanged(added, traces, 'were in it already and kept their place')}."
        )

    # Admins manage queues (the role model); reviewers work them.
    return _bulk_action(request, slug, BulkQueueForm, enqueue, admin=True)


@require_POST
@login_required
def traces_bulk_feedback(request: HttpRequest, slug: str) -> HttpResponse:
    def write(data: dict, traces: list[Trace]) -> str:
        written = record_feedback_on_traces(traces=traces, text=data["text"], reviewer=request.user)
        return (
            f"Wrote the feedback on {_traces(len(traces))}"
            f"{_unchanged(written, traces, 'had the same feedback from you already')}."
        )

    return _bulk_action(request, slug, BulkFeedbackForm, write)
