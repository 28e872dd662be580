"""Invitations: an admin makes a one-time link; opening it makes an account (or takes the
signed-in one) and joins the project in the invited role; expired, used or revoked links fail."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from reviewapp.projects.invitations import create_invitation
from reviewapp.projects.models import Invitation, Membership
from tests.conftest import make_user

MEMBERS = "/p/acme/members/"
STRONG = "kettle-orbit-5-lantern"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def invite(project, alice, role: str = "reviewer") -> str:
    """The path of a new invitation's link."""
    token = create_invitation(
        project=project, invitee="dana@example.com", role=role, invited_by=alice
    )[1]
    return f"/invite/{token}/"


def sign_up(
    path: str, username: str = "dana", password: str = STRONG, client: Client | None = None
):
    return (client or Client()).post(
        path, {"username": username, "password1": password, "password2": password}
    )


def test_an_admin_makes_a_link_shown_once_and_stored_hashed(alice, project):
    client = logged_in(alice)

    response = client.post(f"{MEMBERS}invite/", {"invitee": "dana@example.com", "role": "viewer"})

    assert response.status_code == 302
    html = client.get(MEMBERS).content.decode()
    link = html.split('<pre id="new-invitation-link">')[1].split("</pre>")[0]
    token = link.rsplit("/invite/", 1)[1].strip("/")
    invitation = Invitation.objects.get(project=project)
    assert (invitation.invitee, invitation.role) == ("dana@example.com", "viewer")
    assert invitation.token_hash == Invitation.hash_token(token) != token
    assert invitation.expires_at > timezone.now() + timedelta(days=6)
    assert f'id="invitation-{invitation.pk}"' in html
    assert "new-invitation-link" not in client.get(MEMBERS).content.decode()


def test_a_new_person_makes_an_account_and_joins_in_the_invited_role(alice, project):
    path = invite(project, alice, role="viewer")
    client = Client()
    assert "Create your account" in client.get(path).content.decode()

    response = sign_up(path, client=client)

    assert response.status_code == 302
    assert response["Location"] == "/p/acme/traces/"
    dana = get_user_model().objects.get(username="dana")
    assert dana.check_password(STRONG) and dana.email == "dana@example.com"
    assert Membership.objects.get(project=project, user=dana).role == "viewer"
    assert client.get("/p/acme/traces/").status_code == 200  # signed in as dana
    assert Invitation.objects.get(project=project).accepted_by == dana


def test_a_weak_password_is_refused_with_the_validators_message(alice, project):
    path = invite(project, alice)

    response = sign_up(path, password="password")

    assert response.status_code == 422
    assert "This password is too common." in response.content.decode()
    assert not get_user_model().objects.filter(username="dana").exists()
    assert Invitation.objects.get(project=project).accepted_at is None


def test_a_taken_username_is_refused(alice, project):
    path = invite(project, alice)

    response = sign_up(path, username="alice")

    assert response.status_code == 422
    assert "A user with that username already exists." in response.content.decode()
    assert Invitation.objects.get(project=project).accepted_at is None


def test_a_signed_in_user_joins_directly(alice, project):
    path = invite(project, alice, role="admin")
    erin = make_user("erin")
    client = logged_in(erin)
    assert "Join as erin" in client.get(path).content.decode()

    response = client.post(path)

    assert response.status_code == 302
    assert Membership.objects.get(project=project, user=erin).role == "admin"


def test_a_member_accepting_is_told_and_the_link_stays_open(alice, bob, project):
    path = invite(project, alice, role="admin")

    response = logged_in(bob).post(path)

    assert response.status_code == 409
    assert "bob is already a member" in response.content.decode()
    assert Membership.objects.get(project=project, user=bob).role == "reviewer"
    assert Invitation.objects.get(project=project).accepted_at is None


def test_a_link_works_once(alice, project):
    path = invite(project, alice)
    assert sign_up(path).status_code == 302

    response = sign_up(path, username="eve")

    assert response.status_code == 410
    assert "it has already been used" in response.content.decode()
    assert not get_user_model().objects.filter(username="eve").exists()
    assert logged_in(make_user("frank")).post(path).status_code == 410


def test_an_expired_link_joins_no_one(alice, project):
    path = invite(project, alice)
    Invitation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    response = sign_up(path)

    assert response.status_code == 410
    assert "it has expired" in response.content.decode()
    assert not get_user_model().objects.filter(username="dana").exists()


def test_a_revoked_link_joins_no_one(alice, project):
    path = invite(project, alice)
    invitation = Invitation.objects.get(project=project)
    client = logged_in(alice)

    assert client.post(f"/p/acme/invitations/{invitation.pk}/revoke/").status_code == 302

    assert f'id="invitation-{invitation.pk}"' not in client.get(MEMBERS).content.decode()
    response = sign_up(path)
    assert response.status_code == 410
    assert "an admin of the project revoked it" in response.content.decode()
    assert not Membership.objects.filter(user__username="dana").exists()


def test_an_unknown_link_is_not_found(db):
    assert Client().get("/invite/not-a-token/").status_code == 404


def test_reviewers_cannot_invite_or_revoke(alice, bob, project):
    invite(project, alice)
    invitation = Invitation.objects.get(project=project)
    client = logged_in(bob)

    assert client.post(f"{MEMBERS}invite/", {"invitee": "x", "role": "admin"}).status_code == 403
    assert client.post(f"/p/acme/invitations/{invitation.pk}/revoke/").status_code == 403
    assert Invitation.objects.filter(project=project).count() == 1
    assert Invitation.objects.get(pk=invitation.pk).revoked_at is None


def test_an_admin_cannot_revoke_another_projects_invitation(alice, project, other_project):
    invitation, _ = create_invitation(
        project=other_project, invitee="x", role="admin", invited_by=alice
    )

    response = logged_in(alice).post(f"/p/acme/invitations/{invitation.pk}/revoke/")

    assert response.status_code == 404
    assert Invitation.objects.get(pk=invitation.pk).revoked_at is None
