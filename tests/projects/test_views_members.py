"""The members page: admins see members with their roles and add existing users by username."""

from django.test import Client

from reviewapp.projects.models import Membership
from tests.conftest import make_user

URL = "/p/acme/members/"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_it_lists_members_with_their_roles(alice, bob, victor):
    html = logged_in(alice).get(URL).content.decode()
    for name, role in (("alice", "admin"), ("bob", "reviewer"), ("victor", "viewer")):
        assert f'aria-label="role of {name}"' in html
        row = html[html.index(f"<td>{name}</td>") :]
        assert f'<option value="{role}" selected>' in row[: row.index("</tr>")]


def test_it_is_linked_in_the_nav_for_admins_only(alice, bob):
    assert f'href="{URL}"' in logged_in(alice).get("/p/acme/traces/").content.decode()
    assert f'href="{URL}"' not in logged_in(bob).get("/p/acme/traces/").content.decode()


def test_it_adds_an_existing_user_with_a_role(alice, project):
    dave = make_user("dave")
    response = logged_in(alice).post(URL, {"username": "dave", "role": "viewer"})
    assert response.status_code == 302
    assert response["Location"] == URL
    assert Membership.objects.get(project=project, user=dave).role == "viewer"


def test_it_refuses_an_unknown_username(alice, project):
    response = logged_in(alice).post(URL, {"username": "nobody", "role": "reviewer"})
    assert response.status_code == 422
    assert "no user is called" in response.content.decode()
    assert Membership.objects.filter(project=project).count() == 1


def test_it_refuses_adding_a_member_twice(alice, bob, project):
    response = logged_in(alice).post(URL, {"username": "bob", "role": "admin"})
    assert response.status_code == 422
    assert "already a member" in response.content.decode()
    assert Membership.objects.get(project=project, user=bob).role == "reviewer"


def test_it_forbids_reviewers_and_viewers(bob, victor, project):
    make_user("dave")
    for user in (bob, victor):
        client = logged_in(user)
        assert client.get(URL).status_code == 403
        assert client.post(URL, {"username": "dave", "role": "admin"}).status_code == 403
    assert not Membership.objects.filter(user__username="dave").exists()


def test_it_hides_other_projects(mallory):
    assert logged_in(mallory).get(URL).status_code == 404
