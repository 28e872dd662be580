"""Removing a member: admins only, never the last admin."""

from django.test import Client

from reviewapp.projects.models import Membership


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def remove_url(membership) -> str:
    return f"/p/acme/members/{membership.pk}/remove/"


def membership_of(user, project) -> Membership:
    return Membership.objects.get(project=project, user=user)


def test_it_removes_a_member(alice, bob, project):
    response = logged_in(alice).post(remove_url(membership_of(bob, project)))
    assert response.status_code == 302
    assert not Membership.objects.filter(project=project, user=bob).exists()


def test_a_removed_member_loses_the_project(alice, bob, project):
    logged_in(alice).post(remove_url(membership_of(bob, project)))
    assert logged_in(bob).get("/p/acme/traces/").status_code == 404


def test_the_last_admin_cannot_be_removed(alice, project):
    response = logged_in(alice).post(remove_url(membership_of(alice, project)))
    assert response.status_code == 422
    assert "a project needs an admin" in response.content.decode()
    assert Membership.objects.filter(project=project, user=alice).exists()


def test_it_forbids_reviewers_and_viewers(alice, bob, victor, project):
    target = membership_of(alice, project)
    for user in (bob, victor):
        assert logged_in(user).post(remove_url(target)).status_code == 403
    assert Membership.objects.filter(project=project).count() == 3


def test_a_get_removes_nothing(alice, bob, project):
    assert logged_in(alice).get(remove_url(membership_of(bob, project))).status_code == 405
    assert Membership.objects.filter(project=project, user=bob).exists()


def test_another_projects_member_is_404(alice, mallory, other_project):
    response = logged_in(alice).post(remove_url(membership_of(mallory, other_project)))
    assert response.status_code == 404
    assert Membership.objects.filter(project=other_project, user=mallory).exists()
