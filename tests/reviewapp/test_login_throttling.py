"""Login throttling: wrong passwords lock the account and the address, the admin login included."""

import pytest
from django.test import Client

WRONG = "not the password"
RIGHT = "correct horse battery"  # tests/conftest.py make_user


def login(client: Client, username: str, password: str, url: str = "/login/"):
    return client.post(url, {"username": username, "password": password})


def fail_five_times(client: Client, username: str, url: str = "/login/") -> None:
    for _ in range(5):
        login(client, username, WRONG, url)


def test_four_wrong_passwords_still_let_the_right_one_in(alice):
    client = Client()
    for _ in range(4):
        assert login(client, "alice", WRONG).status_code == 200  # the form, with its error
    assert login(client, "alice", RIGHT).status_code == 302


def test_after_five_wrong_passwords_the_right_one_is_refused(alice):
    client = Client()
    fail_five_times(client, "alice")
    response = login(client, "alice", RIGHT)
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session


def test_a_locked_account_stays_locked_from_another_address(alice):
    fail_five_times(Client(REMOTE_ADDR="10.0.0.1"), "alice")
    assert login(Client(REMOTE_ADDR="10.0.0.2"), "alice", RIGHT).status_code == 429


def test_an_address_guessing_many_accounts_is_locked_out(alice, bob):
    client = Client(REMOTE_ADDR="10.0.0.3")
    for name in ("carol", "dave", "erin", "frank", "grace"):
        login(client, name, WRONG)
    assert login(client, "bob", RIGHT).status_code == 429


@pytest.mark.django_db
def test_the_admin_login_is_throttled_too(django_user_model):
    django_user_model.objects.create_superuser("root", password=RIGHT)
    client = Client()
    fail_five_times(client, "root", "/admin/login/")
    response = login(client, "root", RIGHT, "/admin/login/")
    assert response.status_code == 429
