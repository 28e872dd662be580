"""Changing a member's role: admins only, and the last admin cannot step down."""

from django.test import Client

from reviewapp.projects.models import Membership


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def role_url(membership) -> str:
    return f"/p/acme/members/{membership.pk}/role/"


def membership_of(user, project) -> Membership:
    return Membership.objects.get(project=project, user=user)


def test_it_changes_a_role(alice, bob, project):
    response = logged_in(alice).post(role_url(membership_of(bob, project)), {"role": "admin"})
    assert response.status_code == 302
    assert membership_of(bob, project).role == "admin"


def test_the_last_admin_cannot_step_down(alice, project):
    response = logged_in(alice).post(role_url(membership_of(alice, project)), {"role": "viewer"})
    assert response.status_code == 422
    assert "a project needs an admin" in response.content.decode()
    assert membership_of(alice, project).role == "admin"


def test_an_admin_can_step_down_when_another_remains(alice, bob, project):
    Membership.objects.filter(project=project, user=bob).update(role="admin")
    logged_in(alice).post(role_url(membership_of(alice, project)), {"role": "reviewer"})
    assert membership_of(alice, project).role == "reviewer"


def test_it_refuses_an_unknown_role(alice, bob, project):
    response = logged_in(alice).post(role_url(membership_of(bob, project)), {"role": "owner"})
    assert response.status_code == 422
    assert membership_of(bob, project).role == "reviewer"


def test_it_forbids_reviewers_and_viewers(alice, bob, victor, project):
    for user in (bob, victor):
        response = logged_in(user).post(role_url(membership_of(user, project)), {"role": "admin"})
        assert response.status_code == 403
    assert membership_of(bob, project).role == "reviewer"
    assert membership_of(victor, project).role == "viewer"


def test_another_projects_member_is_404(alice, mallory, other_project):
    response = logged_in(alice).post(
        role_url(membership_of(mallory, other_project)), {"role": "viewer"}
    )
    assert response.status_code == 404
    assert membership_of(mallory, other_project).role == "admin"
