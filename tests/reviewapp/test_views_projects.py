from django.test import Client

from reviewapp.models import ApiKey, Tag
from tests.factories import ApiClient


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_adds_a_tag_to_the_taxonomy(alice, project):
    response = logged_in(alice).post("/p/acme/tags/", {"name": "wrong-tool"})
    assert response.status_code == 302
    assert Tag.objects.filter(project=project, name="wrong-tool").exists()


def test_a_child_tag_names_its_parent(alice, project):
    parent = Tag.objects.create(project=project, name="tools")
    logged_in(alice).post("/p/acme/tags/", {"name": "bad-args", "parent": parent.pk})
    assert Tag.objects.get(name="bad-args").parent == parent


def test_a_duplicate_tag_rerenders_with_422(alice, project):
    Tag.objects.create(project=project, name="slow")
    response = logged_in(alice).post(
        "/p/acme/tags/", {"name": "slow"}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422
    assert "already a tag" in response.content.decode()


def test_a_reviewer_reads_but_cannot_change_the_taxonomy(bob, project):
    client = logged_in(bob)
    assert client.get("/p/acme/tags/").status_code == 200
    assert client.post("/p/acme/tags/", {"name": "x"}).status_code == 403
    assert not Tag.objects.exists()


def test_an_admin_creates_a_key_that_is_shown_once_and_works(alice, project):
    client = logged_in(alice)
    html = client.post(
        "/p/acme/keys/", {"name": "harness", "scopes": ["ingest"]}, follow=True
    ).content.decode()
    secret = html.split('id="new-secret">')[1].split("<")[0]
    assert ApiClient(secret).get("/api/v1/traces").status_code == 200
    assert secret not in client.get("/p/acme/keys/").content.decode()


def test_an_admin_revokes_a_key(alice, project, api_key):
    key = ApiKey.objects.get(project=project)
    logged_in(alice).post(f"/p/acme/keys/{key.pk}/revoke/")
    assert ApiClient(api_key).get("/api/v1/traces").status_code == 401


def test_reviewers_and_other_projects_cannot_see_keys(bob, mallory, project):
    assert logged_in(bob).get("/p/acme/keys/").status_code == 403
    assert logged_in(mallory).get("/p/acme/keys/").status_code == 404


def test_another_projects_admin_cannot_revoke_my_key(mallory, project, api_key):
    key = ApiKey.objects.get(project=project)
    assert logged_in(mallory).post(f"/p/acme/keys/{key.pk}/revoke/").status_code == 404
    assert ApiClient(api_key).get("/api/v1/traces").status_code == 200


def test_home_sends_a_one_project_member_to_its_traces(bob):
    response = logged_in(bob).get("/")
    assert response["Location"] == "/p/acme/traces/"


def test_login_page_logs_in(bob):
    client = Client()
    response = client.post("/login/", {"username": "bob", "password": "correct horse battery"})
    assert response.status_code == 302
    assert client.get("/p/acme/traces/").status_code == 200
