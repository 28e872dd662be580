"""Every lookup of a project's rows goes through these and each wing's own `access` module
(traces, review, learning), so no view or endpoint forgets whose project it is: another
project's row does not exist here (404)."""

from typing import TypeVar

from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404

from reviewapp.projects.models import Membership, Project, Role

RowT = TypeVar("RowT", bound=Model)


def first_or_404(rows: QuerySet[RowT], missing: str) -> RowT:
    """The first of `rows`, already narrowed to one project; none: a 404 saying `missing`."""
    row = rows.first()
    if row is None:
        raise Http404(missing)
    return row


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


def get_member_for_membership(membership: Membership, member_id: int) -> Membership:
    """Another person's membership of the same project (the members page changes it)."""
    members = Membership.objects.filter(project=membership.project, pk=member_id)
    return first_or_404(members, "no such member")


def projects_for_user(user) -> list[Project]:
    if user.is_superuser:
        return list(Project.objects.order_by("slug"))
    return list(Project.objects.filter(memberships__user=user).order_by("slug"))
