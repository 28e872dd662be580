"""Every dashboard lookup goes through these, so no view forgets whose project it is."""

from django.core.exceptions import PermissionDenied
from django.http import Http404

from reviewapp.projects.models import Membership, Project, Role
from reviewapp.traces.models import Trace


def get_membership_for_user(user, slug: str) -> Membership:
    """The user's membership of a project; a project they are not in does not exist (404)."""
    membership = (
        Membership.objects.select_related("project").filter(user=user, project__slug=slug).first()
    )
    if membership is not None:
        return membership
    if user.is_superuser:
        project = Project.objects.filter(slug=slug).first()
        if project is not None:
            return Membership(project=project, user=user, role=Role.ADMIN)
    raise Http404("no such project")


def get_reviewer_membership_for_user(user, slug: str) -> Membership:
    membership = get_membership_for_user(user, slug)
    if not membership.can_review:
        raise PermissionDenied("viewers cannot change reviews")
    return membership


def get_admin_membership_for_user(user, slug: str) -> Membership:
    membership = get_membership_for_user(user, slug)
    if not membership.is_admin:
        raise PermissionDenied("only project admins can do this")
    return membership


def get_trace_for_membership(membership: Membership, trace_id: int) -> Trace:
    trace = Trace.objects.filter(project=membership.project, pk=trace_id).first()
    if trace is None:
        raise Http404("no such trace")
    return trace


def projects_for_user(user) -> list[Project]:
    if user.is_superuser:
        return list(Project.objects.order_by("slug"))
    return list(Project.objects.filter(memberships__user=user).order_by("slug"))
