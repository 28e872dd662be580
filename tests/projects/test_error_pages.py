"""The 403, 404 and 500 pages are the product's own, on a minimal layout that needs no database."""

from django.conf import settings as django_settings
from django.test import Client, RequestFactory
from django.views.defaults import server_error

from tests.conftest import make_user


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_wrong_address_gets_the_styled_404(db, settings):
    settings.DEBUG = False

    response = Client().get("/no/such/page/")

    assert response.status_code == 404
    html = response.content.decode()
    assert "<h1>Page not found</h1>" in html
    assert 'rel="stylesheet"' in html and "app.css" in html


def test_a_project_one_is_not_a_member_of_is_the_styled_404(alice, settings):
    settings.DEBUG = False
    outsider = make_user("oscar")

    response = logged_in(outsider).get("/p/acme/settings/")

    assert response.status_code == 404
    assert "<h1>Page not found</h1>" in response.content.decode()


def test_a_reviewer_opening_members_gets_the_styled_403_saying_who_may(bob, settings):
    settings.DEBUG = True  # PermissionDenied is answered with 403.html in every mode

    response = logged_in(bob).get("/p/acme/members/")

    assert response.status_code == 403
    html = response.content.decode()
    assert "<h1>You cannot open this page</h1>" in html
    assert "Only project admins can do this." in html


def test_the_500_page_renders_without_a_request_context(db):
    assert not django_settings.DEBUG
    response = server_error(RequestFactory().get("/"))

    assert response.status_code == 500
    assert "<h1>Something went wrong</h1>" in response.content.decode()
