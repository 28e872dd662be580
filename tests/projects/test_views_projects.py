import pytest
from django.test import Client

from reviewapp.monitors.models import TriageRule
from reviewapp.projects.models import ApiKey
from reviewapp.review.models import Queue
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import ApiClient, make_trace


@pytest.fixture
def queue(project):
    return Queue.objects.create(project=project, name="slow ones")


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


def test_an_admin_renames_a_tag(alice, project):
    tag = Tag.objects.create(project=project, name="slow")
    response = logged_in(alice).post(f"/p/acme/tags/{tag.pk}/rename/", {"name": "too-slow"})
    assert response.status_code == 302
    tag.refresh_from_db()
    assert tag.name == "too-slow"


def test_renaming_to_a_taken_name_is_422_and_says_merge(alice, project):
    tag = Tag.objects.create(project=project, name="slow")
    Tag.objects.create(project=project, name="late")
    response = logged_in(alice).post(
        f"/p/acme/tags/{tag.pk}/rename/", {"name": "late"}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422
    assert "merge into it instead" in response.content.decode()
    tag.refresh_from_db()
    assert tag.name == "slow"


def test_merging_moves_traces_children_and_rules_and_keeps_one_tag_per_reviewer(
    alice, bob, project, queue
):
    ingest_traces(project=project, raw_items=[make_trace("t-1"), make_trace("t-2")])
    first, second = project.traces.order_by("external_id")
    slow, late = (Tag.objects.create(project=project, name=n) for n in ("slow", "late"))
    child = Tag.objects.create(project=project, name="slow-tool", parent=slow)
    TraceTag.objects.create(trace=first, tag=slow, reviewer=bob)
    TraceTag.objects.create(trace=first, tag=late, reviewer=bob)  # both on by bob: one stays
    TraceTag.objects.create(trace=second, tag=slow, reviewer=alice)
    rule = TriageRule.objects.create(project=project, name="Slow", queue=queue, tag=slow)

    response = logged_in(alice).post(f"/p/acme/tags/{slow.pk}/merge/", {"into": late.pk})

    assert response.status_code == 302
    assert not Tag.objects.filter(pk=slow.pk).exists()
    assert sorted(TraceTag.objects.values_list("trace__external_id", "tag__name", "reviewer")) == [
        ("t-1", "late", bob.pk),
        ("t-2", "late", alice.pk),
    ]
    child.refresh_from_db()
    rule.refresh_from_db()
    assert child.parent == late and rule.tag == late


def test_a_tag_cannot_be_merged_into_its_own_child(alice, project):
    parent = Tag.objects.create(project=project, name="tools")
    child = Tag.objects.create(project=project, name="bad-args", parent=parent)
    response = logged_in(alice).post(f"/p/acme/tags/{parent.pk}/merge/", {"into": child.pk})
    assert response.status_code == 422
    assert Tag.objects.filter(pk=parent.pk).exists()


def test_deleting_a_tag_takes_it_off_traces_and_lifts_its_children(alice, bob, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    root = Tag.objects.create(project=project, name="tools")
    doomed = Tag.objects.create(project=project, name="args", parent=root)
    child = Tag.objects.create(project=project, name="bad-json", parent=doomed)
    TraceTag.objects.create(trace=project.traces.get(), tag=doomed, reviewer=bob)

    assert logged_in(alice).post(f"/p/acme/tags/{doomed.pk}/delete/").status_code == 302

    assert not TraceTag.objects.exists()
    child.refresh_from_db()
    assert child.parent == root


def test_a_tag_a_triage_rule_routes_on_is_not_deleted(alice, project, queue):
    tag = Tag.objects.create(project=project, name="slow")
    TriageRule.objects.create(project=project, name="Slow", queue=queue, tag=tag)
    response = logged_in(alice).post(
        f"/p/acme/tags/{tag.pk}/delete/", headers={"HX-Request": "true"}
    )
    assert response.status_code == 422
    assert "triage rule “Slow” routes on it" in response.content.decode()
    assert Tag.objects.filter(pk=tag.pk).exists() and TriageRule.objects.exists()


def test_only_admins_of_the_project_rename_merge_or_delete(bob, mallory, project):
    slow, late = (Tag.objects.create(project=project, name=n) for n in ("slow", "late"))
    for user, status in ((bob, 403), (mallory, 404)):
        client = logged_in(user)
        assert client.post(f"/p/acme/tags/{slow.pk}/rename/", {"name": "x"}).status_code == status
        merge = client.post(f"/p/acme/tags/{slow.pk}/merge/", {"into": late.pk})
        assert merge.status_code == status
        assert client.post(f"/p/acme/tags/{slow.pk}/delete/").status_code == status
    assert sorted(Tag.objects.values_list("name", flat=True)) == ["late", "slow"]


def test_another_projects_tag_is_404(alice, other_project):
    theirs = Tag.objects.create(project=other_project, name="theirs")
    assert logged_in(alice).post(f"/p/acme/tags/{theirs.pk}/delete/").status_code == 404
    assert Tag.objects.filter(pk=theirs.pk).exists()
