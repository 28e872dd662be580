"""The top bar's project switcher comes from one context processor, on every dashboard page."""

import pytest
from django.test import Client

from reviewapp.projects.models import Membership

PAGES = ["traces/", "queues/", "triage/", "triage/clusters/", "tags/", "targets/", "adapters/"]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("page", PAGES)
def test_the_switcher_lists_each_project_of_the_user(alice, other_project, page):
    Membership.objects.create(project=other_project, user=alice, role="viewer")

    html = logged_in(alice).get(f"/p/acme/{page}").content.decode()

    assert 'href="/p/globex/traces/">Globex</a>' in html


def test_the_switcher_leaves_out_projects_the_user_is_not_in(bob, other_project):
    html = logged_in(bob).get("/p/acme/queues/").content.decode()

    assert 'href="/p/acme/traces/">Acme support agent</a>' in html
    assert "Globex" not in html
