"""A project's traces, looked up for a member or a key (projects.access: another project's
trace does not exist here)."""

from reviewapp.projects.access import first_or_404
from reviewapp.projects.models import Membership, Project
from reviewapp.traces.models import Trace


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
