"""Invitations: an admin makes a one-time link; opening it joins a person to the project, with a
new account or the one they are signed in to. Accounts are made here, not in Django's admin."""

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from reviewapp.projects.models import Invitation, Membership, Project


class InvitationError(ValueError):
    """A link that does not join anyone; the message says why."""


def create_invitation(
    *, project: Project, invitee: str, role: str, invited_by: AbstractBaseUser
) -> tuple[Invitation, str]:
    """Store a new invitation's hash; its token (the link) is returned once and never again."""
    token = Invitation.new_token()
    invitation = Invitation.objects.create(
        project=project,
        invitee=invitee.strip(),
        role=role,
        token_hash=Invitation.hash_token(token),
        invited_by=invited_by,
        expires_at=timezone.now() + Invitation.LIFETIME,
    )
    return invitation, token


def invitation_for_token(token: str) -> Invitation | None:
    """The invitation behind a link, open or not (the page says why a closed one is closed)."""
    return (
        Invitation.objects.select_related("project")
        .filter(token_hash=Invitation.hash_token(token))
        .first()
    )


def open_invitations(project: Project) -> list[Invitation]:
    now = timezone.now()
    return list(
        Invitation.objects.filter(
            project=project, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
        ).order_by("-created_at")
    )


@transaction.atomic
def accept_invitation(*, invitation: Invitation, user: AbstractBaseUser) -> Membership:
    """Join `user` to the invitation's project in its role; the link works once."""
    if Membership.objects.filter(project=invitation.project, user=user).exists():
        raise InvitationError(f"{user.get_username()} is already a member of this project")
    now = timezone.now()
    # Claimed with a conditional UPDATE: two people opening the link at once cannot both join.
    claimed = Invitation.objects.filter(
        pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
    ).update(accepted_at=now, accepted_by=user)
    if not claimed:
        invitation.refresh_from_db()
        raise InvitationError(f"this invitation no longer works: {invitation.closed_because(now)}")
    return Membership.objects.create(project=invitation.project, user=user, role=invitation.role)


@transaction.atomic
def sign_up_by_invitation(*, invitation: Invitation, username: str, password: str) -> Membership:
    """A new account (the password already through the validators) joined by the invitation;
    no account is left behind when the link no longer works."""
    email = invitation.invitee if "@" in invitation.invitee else ""
    user = get_user_model().objects.create_user(username, email=email, password=password)
    return accept_invitation(invitation=invitation, user=user)


@transaction.atomic
def revoke_invitation(*, invitation: Invitation) -> None:
    Invitation.objects.filter(
        pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=timezone.now())
