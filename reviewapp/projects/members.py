"""Who belongs to a project and in what role; a project always keeps one admin."""

from django.contrib.auth import get_user_model
from django.db import transaction

from reviewapp.projects.models import Membership, Project, Role


class MemberError(ValueError):
    """A change the members page refuses; the message says why."""


def _lock_admins(project: Project) -> int:
    """Lock the project's admin rows and count them, so two demotions cannot both pass."""
    return len(
        Membership.objects.select_for_update().filter(project=project, role=Role.ADMIN).values("pk")
    )


@transaction.atomic
def add_member(*, project: Project, username: str, role: str) -> Membership:
    """Give an existing user a role in the project."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise MemberError(f"no user is called {username!r}; they need an account first")
    membership, created = Membership.objects.get_or_create(
        project=project, user=user, defaults={"role": role}
    )
    if not created:
        raise MemberError(f"{username} is already a member ({membership.role})")
    return membership


@transaction.atomic
def change_role(*, membership: Membership, role: str) -> Membership:
    """Set a member's role; the last admin cannot step down."""
    stepping_down = membership.role == Role.ADMIN and role != Role.ADMIN
    if stepping_down and _lock_admins(membership.project) <= 1:
        raise MemberError("a project needs an admin: make someone else admin first")
    Membership.objects.filter(pk=membership.pk).update(role=role)
    membership.role = role
    return membership


@transaction.atomic
def remove_member(*, membership: Membership) -> None:
    """Take a user out of the project; the last admin cannot be removed."""
    if membership.role == Role.ADMIN and _lock_admins(membership.project) <= 1:
        raise MemberError("a project needs an admin: make someone else admin first")
    membership.delete()
