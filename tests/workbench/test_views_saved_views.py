"""Saved views on the trace list: a reviewer names the filters, keeps them or shares them, and
deletes what is theirs (an admin, what is shared)."""

import pytest
from django.test import Client

from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import SavedView
from reviewapp.traces.saved_views import save_view
from tests.factories import make_trace

LIST = "/p/acme/traces/"
SAVE = "/p/acme/traces/views/"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def delete_url(view, slug="acme") -> str:
    return f"/p/{slug}/traces/views/{view.pk}/delete/"


@pytest.fixture
def traces(project):
    items = [make_trace("t-done"), make_trace("t-late", termination="timeout")]
    ingest_traces(project=project, raw_items=items)


def saved(project, owner, name="Timeouts", query="termination=timeout", shared=False):
    return save_view(project=project, owner=owner, name=name, query=query, shared=shared)


def test_a_reviewer_saves_the_filters_and_lands_on_them(bob, traces):
    response = logged_in(bob).post(
        SAVE, {"view-name": "Timeouts", "view-query": "termination=timeout&cursor=9"}
    )
    view = SavedView.objects.get()
    assert (view.name, view.query, view.shared, view.owner) == (
        "Timeouts",
        "termination=timeout",
        False,
        bob,
    )
    assert response.status_code == 302 and response["Location"] == f"{LIST}?termination=timeout"


def test_the_list_links_each_saved_view_to_its_filters(bob, traces, project):
    saved(project, bob)
    html = logged_in(bob).get(LIST).content.decode()
    assert f'href="{LIST}?termination=timeout">Timeouts</a>' in html


def test_a_private_view_shows_to_its_owner_only(alice, bob, project, traces):
    saved(project, bob, name="Mine")
    assert "Mine" in logged_in(bob).get(LIST).content.decode()
    assert "Mine" not in logged_in(alice).get(LIST).content.decode()


def test_a_shared_view_shows_to_every_member_with_its_owner(bob, victor, project, traces):
    saved(project, bob, name="Team timeouts", shared=True)
    html = logged_in(victor).get(LIST).content.decode()
    assert "Team timeouts</a>" in html and "shared by bob" in html


def test_a_duplicate_name_is_refused_with_the_forms_error(bob, project, traces):
    saved(project, bob, name="Timeouts")
    response = logged_in(bob).post(SAVE, {"view-name": "timeouts", "view-query": "q=x"})
    assert response.status_code == 422
    assert "you already have a view named “timeouts”" in response.content.decode()
    assert SavedView.objects.count() == 1


def test_another_reviewer_may_use_the_same_name(alice, bob, project, traces):
    saved(project, bob, name="Timeouts")
    response = logged_in(alice).post(SAVE, {"view-name": "Timeouts", "view-query": ""})
    assert response.status_code == 302 and response["Location"] == LIST
    assert SavedView.objects.filter(name="Timeouts").count() == 2


def test_filters_the_list_would_refuse_are_not_saved(bob, traces):
    response = logged_in(bob).post(
        SAVE, {"view-name": "Odd", "view-query": "termination=sometimes"}
    )
    assert response.status_code == 422
    assert "these filters cannot be saved" in response.content.decode()
    assert not SavedView.objects.exists()


def test_a_view_without_a_name_is_refused(bob, traces):
    response = logged_in(bob).post(SAVE, {"view-name": "", "view-query": "q=x"})
    assert response.status_code == 422
    assert not SavedView.objects.exists()


def test_a_viewer_cannot_save_a_view(victor, traces):
    response = logged_in(victor).post(SAVE, {"view-name": "Mine", "view-query": ""})
    assert response.status_code == 403
    assert not SavedView.objects.exists()


def test_saving_needs_a_csrf_token(bob, traces):
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    assert client.post(SAVE, {"view-name": "Mine"}).status_code == 403


def test_the_owner_deletes_their_view(bob, project, traces):
    view = saved(project, bob)
    response = logged_in(bob).post(delete_url(view), {"filters": "q=x"})
    assert response.status_code == 302 and response["Location"] == f"{LIST}?q=x"
    assert not SavedView.objects.exists()


def test_an_admin_deletes_a_shared_view(alice, bob, project, traces):
    view = saved(project, bob, shared=True)
    assert logged_in(alice).post(delete_url(view)).status_code == 302
    assert not SavedView.objects.exists()


def test_a_reviewer_cannot_delete_another_reviewers_shared_view(alice, bob, project, traces):
    view = saved(project, alice, shared=True)
    assert logged_in(bob).post(delete_url(view)).status_code == 403
    assert SavedView.objects.exists()


def test_another_members_private_view_does_not_exist_even_for_an_admin(alice, bob, project):
    view = saved(project, bob)
    assert logged_in(alice).post(delete_url(view)).status_code == 404
    assert SavedView.objects.exists()


def test_another_projects_member_cannot_delete_or_save(mallory, bob, project, other_project):
    view = saved(project, bob, shared=True)
    client = logged_in(mallory)
    assert client.post(delete_url(view)).status_code == 404
    assert client.post(delete_url(view, slug="globex")).status_code == 404
    assert client.post(SAVE, {"view-name": "Theirs", "view-query": ""}).status_code == 404
    assert SavedView.objects.count() == 1
