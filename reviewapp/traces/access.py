"""A project's traces, looked up for a member or a key (projects.access: another project's
trace does not exist here)."""

from django.db.models import Q
from django.http import Http404

from reviewapp.projects.access import first_or_404
from reviewapp.projects.models import Membership, Project
from reviewapp.traces.models import SavedView, Trace


def get_trace_for_membership(membership: Membership, trace_id: int) -> Trace:
    return first_or_404(
        Trace.objects.filter(project=membership.project, pk=trace_id), "no such trace"
    )


def get_trace_for_project(project: Project, external_id: str) -> Trace:
    """The API's way in: a trace by the id its harness gave it."""
    return first_or_404(
        Trace.objects.filter(project=project, external_id=external_id),
        f"no trace {external_id!r} in this project",
    )


def get_traces_for_membership(membership: Membership, trace_ids: list[str]) -> list[Trace]:
    """The traces a form ticked, newest first, without their bodies; one that is not the
    project's (or no trace at all) makes the whole request a 404."""
    wanted = set(trace_ids)
    if not all(trace_id.isdigit() for trace_id in wanted):
        raise Http404("no such trace")
    traces = list(
        Trace.objects.filter(project=membership.project, pk__in=[int(pk) for pk in wanted])
        .defer("body", "metadata", "search_text")
        .order_by("-id")
    )
    if len(traces) != len(wanted):
        raise Http404("no such trace")
    return traces


def saved_views_for_membership(membership: Membership) -> list[SavedView]:
    """The views a member sees on the trace list: their own and those shared, by name."""
    return list(
        SavedView.objects.filter(project=membership.project)
        .filter(Q(owner=membership.user) | Q(shared=True))
        .select_related("owner")
        .order_by("name", "id")
    )


def get_saved_view_for_membership(membership: Membership, view_id: int) -> SavedView:
    """One of the member's own views or a shared one; another's private view does not exist."""
    views = SavedView.objects.filter(project=membership.project, pk=view_id).filter(
        Q(owner=membership.user) | Q(shared=True)
    )
    return first_or_404(views, "no such saved view")
