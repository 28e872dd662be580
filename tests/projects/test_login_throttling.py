"""Login throttling: wrong passwords lock one account from one address, the admin login included.

A stranger's failures from address A must not lock the owner out from address B; A is refused
for that account (429, with how long and Retry-After), and an address spraying many accounts is
refused for all of them once it passes a higher limit of its own.
"""

from datetime import timedelta

import httpx
import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from django.db import connections
from django.db.models import F
from django.test import Client

WRONG = "not the password"
RIGHT = "correct horse battery"  # tests/conftest.py make_user
STRANGER = "10.0.0.1"
OWNER = "10.0.0.2"
COOLOFF_SECONDS = 15 * 60  # LOGIN_LOCKOUT_MINUTES' default


def login(client: Client, username: str, password: str, url: str = "/login/"):
    return client.post(url, {"username": username, "password": password})


def fail_five_times(client: Client, username: str, url: str = "/login/") -> None:
    for _ in range(5):
        login(client, username, WRONG, url)


def age_failures(minutes: int) -> None:
    """Move every recorded failure this many minutes into the past."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=minutes))


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", password=RIGHT)


def test_four_wrong_passwords_still_let_the_right_one_in(alice):
    client = Client()
    for _ in range(4):
        assert login(client, "alice", WRONG).status_code == 200  # the form, with its error
    assert login(client, "alice", RIGHT).status_code == 302


def test_a_strangers_failures_do_not_lock_the_owner_out_from_another_address(alice):
    fail_five_times(Client(REMOTE_ADDR=STRANGER), "alice")
    owner = Client(REMOTE_ADDR=OWNER)
    assert login(owner, "alice", RIGHT).status_code == 302
    assert owner.session["_auth_user_id"] == str(alice.pk)


def test_a_strangers_failures_do_not_lock_the_owner_out_of_the_admin(root):
    fail_five_times(Client(REMOTE_ADDR=STRANGER), "root", "/admin/login/")
    owner = Client(REMOTE_ADDR=OWNER)
    assert login(owner, "root", RIGHT, "/admin/login/").status_code == 302
    assert owner.session["_auth_user_id"] == str(root.pk)


def test_after_five_failures_the_address_is_refused_the_right_password_too(alice):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "alice")
    response = login(stranger, "alice", RIGHT)
    assert response.status_code == 429
    assert "_auth_user_id" not in stranger.session


def test_the_refusal_says_how_long_and_sends_retry_after(alice):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "alice")
    response = login(stranger, "alice", RIGHT)
    assert response.status_code == 429
    # The time left, counted from the fifth failure a moment ago.
    assert COOLOFF_SECONDS - 5 <= int(response["Retry-After"]) <= COOLOFF_SECONDS
    assert "Try again in 15 minutes." in response.content.decode()


def test_the_fifth_failure_itself_is_refused_with_the_whole_cooloff(alice):
    stranger = Client(REMOTE_ADDR=STRANGER)
    for _ in range(4):
        login(stranger, "alice", WRONG)
    response = login(stranger, "alice", WRONG)
    assert response.status_code == 429
    assert response["Retry-After"] == str(COOLOFF_SECONDS)


def test_retry_after_counts_down_and_a_refused_try_does_not_restart_it(alice):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "alice")
    age_failures(minutes=10)
    login(stranger, "alice", WRONG)  # refused, not counted
    response = login(stranger, "alice", RIGHT)
    assert response.status_code == 429
    assert 5 * 60 - 5 <= int(response["Retry-After"]) <= 5 * 60
    assert "Try again in 5 minutes." in response.content.decode()


def test_the_lock_lifts_after_the_cooloff(alice):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "alice")
    age_failures(minutes=15)
    assert login(stranger, "alice", RIGHT).status_code == 302


def test_the_refusal_names_the_account_and_address_pair_not_a_locked_account(alice):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "alice")
    body = login(stranger, "alice", RIGHT).content.decode()
    assert "Too many failed logins for this account from your address." in body
    assert "account locked" not in body.lower()
    assert "account is locked" not in body.lower()


def test_the_refusal_page_is_the_sites_own(alice):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "alice")
    response = login(stranger, "alice", RIGHT)
    assert response["Content-Type"].startswith("text/html")
    body = response.content.decode()
    assert 'class="topbar"' in body
    assert "css/app" in body


@pytest.mark.django_db
def test_the_refusal_page_escapes_what_was_posted():
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "<script>alert(1)</script>")
    response = login(stranger, "<script>alert(1)</script>", WRONG)
    assert response.status_code == 429
    assert "<script>alert(1)" not in response.content.decode()


def test_the_admin_login_is_refused_with_how_long_too(root):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "root", "/admin/login/")
    response = login(stranger, "root", RIGHT, "/admin/login/")
    assert response.status_code == 429
    assert COOLOFF_SECONDS - 5 <= int(response["Retry-After"]) <= COOLOFF_SECONDS
    body = response.content.decode()
    assert "Too many failed logins for this account from your address." in body
    assert "Try again in 15 minutes." in body


def test_failures_on_one_login_count_on_the_other(root):
    stranger = Client(REMOTE_ADDR=STRANGER)
    fail_five_times(stranger, "root", "/admin/login/")
    assert login(stranger, "root", RIGHT).status_code == 429


def test_an_address_spraying_many_accounts_is_refused_for_all_of_them(settings, alice, bob):
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 8
    sprayer = Client(REMOTE_ADDR=STRANGER)
    for name in ("carol", "dave", "erin", "frank"):
        for _ in range(2):  # below the pair limit for each account
            login(sprayer, name, WRONG)
    response = login(sprayer, "bob", RIGHT)
    assert response.status_code == 429
    body = response.content.decode()
    assert "Too many failed logins from your address." in body
    assert "this account" not in body
    assert int(response["Retry-After"]) > 0
    assert login(Client(REMOTE_ADDR=OWNER), "bob", RIGHT).status_code == 302


def test_an_address_below_its_own_limit_still_logs_in_other_accounts(alice, bob):
    client = Client(REMOTE_ADDR=STRANGER)
    for name in ("carol", "dave", "erin", "frank", "grace"):
        login(client, name, WRONG)
    assert login(client, "bob", RIGHT).status_code == 302


@pytest.fixture
async def served_app(transactional_db):
    from reviewapp.asgi import application

    yield application
    await sync_to_async(connections.close_all)()  # the views' thread's, or teardown waits on it


async def _login_over_asgi(app, address: str, username: str, password: str) -> httpx.Response:
    """Log in through the served ASGI application (async middleware), CSRF token and all."""
    transport = httpx.ASGITransport(app=app, client=(address, 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        await client.get("/login/")
        return await client.post(
            "/login/",
            data={"username": username, "password": password},
            headers={"X-CSRFToken": client.cookies["csrftoken"]},
        )


async def test_the_served_application_refuses_with_how_long_too(served_app, django_user_model):
    await django_user_model.objects.acreate_user("alice", password=RIGHT)
    for _ in range(5):
        await _login_over_asgi(served_app, STRANGER, "alice", WRONG)
    response = await _login_over_asgi(served_app, STRANGER, "alice", RIGHT)
    assert response.status_code == 429
    assert COOLOFF_SECONDS - 5 <= int(response.headers["Retry-After"]) <= COOLOFF_SECONDS
    assert "Try again in 15 minutes." in response.text
    assert (await _login_over_asgi(served_app, OWNER, "alice", RIGHT)).status_code == 302
