"""The invitation services: a link is claimed with a conditional UPDATE, so two people holding
the same open invitation cannot both join, and a refused sign-up leaves no account behind."""

import pytest
from django.contrib.auth import get_user_model

from reviewapp.projects.invitations import (
    InvitationError,
    accept_invitation,
    create_invitation,
    invitation_for_token,
    sign_up_by_invitation,
)
from reviewapp.projects.models import Membership
from tests.conftest import make_user


def test_the_second_of_two_holders_of_one_open_invitation_is_refused(alice, project):
    token = create_invitation(project=project, invitee="team", role="viewer", invited_by=alice)[1]
    first, second = invitation_for_token(token), invitation_for_token(token)  # both read it open
    erin, frank = make_user("erin"), make_user("frank")

    accept_invitation(invitation=first, user=erin)
    with pytest.raises(InvitationError, match="already been used"):
        accept_invitation(invitation=second, user=frank)

    assert list(
        Membership.objects.filter(project=project, role="viewer").values_list(
            "user__username", flat=True
        )
    ) == ["erin"]


def test_a_sign_up_on_a_used_invitation_leaves_no_account(alice, project):
    token = create_invitation(project=project, invitee="team", role="viewer", invited_by=alice)[1]
    stale = invitation_for_token(token)
    accept_invitation(invitation=invitation_for_token(token), user=make_user("erin"))

    with pytest.raises(InvitationError):
        sign_up_by_invitation(invitation=stale, username="frank", password="kettle-orbit-5")

    assert not get_user_model().objects.filter(username="frank").exists()
