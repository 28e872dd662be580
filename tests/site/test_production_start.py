"""The production start path: `manage.py serve_web` with DJANGO_DEBUG=false, as docs/deploy.md
runs it. Pages and their static files answer 200 without anyone running collectstatic first."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.conf import global_settings
from django.db import connection

from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace
from tests.fake_upstream import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
# What docs/deploy.md asks production to set (the values here are test values).
PRODUCTION_ENV = {
    "DJANGO_DEBUG": "false",
    "DJANGO_SECRET_KEY": "test-only-production-secret-key-0123456789-abcdefghijklmnopqrstuv",
    "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://127.0.0.1",
}
# TLS ends at the proxy in front, which says so in this header.
BEHIND_TLS = {"X-Forwarded-Proto": "https"}


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


class Browser:
    """httpx with its own cookie handling: production cookies are Secure, and this talks plain
    HTTP to the web process as the TLS proxy does."""

    def __init__(self, base_url: str):
        self.client = httpx.Client(base_url=base_url, timeout=30)
        self.cookies: dict[str, str] = {}

    def _headers(self) -> dict[str, str]:
        cookie = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        return {**BEHIND_TLS, "Cookie": cookie, "Referer": "https://127.0.0.1/login/"}

    def _keep_cookies(self, response: httpx.Response) -> httpx.Response:
        self.cookies.update({cookie.name: cookie.value for cookie in response.cookies.jar})
        return response

    def get(self, path: str) -> httpx.Response:
        return self._keep_cookies(self.client.get(path, headers=self._headers()))

    def post(self, path: str, data: dict) -> httpx.Response:
        return self._keep_cookies(self.client.post(path, data=data, headers=self._headers()))


@pytest.fixture(autouse=True)
def production_password_hashing(settings):
    """alice signs in on the production web process, which knows only the production hashers
    (the suite's conftest makes users with MD5)."""
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS


@pytest.fixture
def production_web(tmp_path):
    """`serve_web` with production settings on a free port, STATIC_ROOT empty at start."""
    port = free_port()
    log = tmp_path / "web.log"
    env = {
        **os.environ,
        **PRODUCTION_ENV,
        "DATABASE_URL": _database_url(),
        "DJANGO_STATIC_ROOT": str(tmp_path / "static"),
    }
    with open(log, "w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "serve_web", "--port", str(port), "--workers", "1"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            pytest.fail(f"serve_web exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(f"{base_url}/login/", headers=BEHIND_TLS, timeout=2)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                pytest.fail(f"serve_web did not answer:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
    yield Browser(base_url)
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=30)


def _assert_static_files_answer(browser: Browser, page: httpx.Response) -> None:
    static_urls = re.findall(r'(?:href|src)="(/static/[^"]+)"', page.text)
    assert static_urls, "the page links no static files"
    for url in static_urls:
        assert browser.get(url).status_code == 200, url


@pytest.mark.django_db(transaction=True)
def test_production_start_serves_login_trace_list_and_trace_page_with_static_files(
    production_web, project, alice
):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    trace = project.traces.get()
    browser = production_web

    login = browser.get("/login/")
    assert login.status_code == 200
    _assert_static_files_answer(browser, login)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
    logged_in = browser.post(
        "/login/",
        {"username": "alice", "password": "correct horse battery", "csrfmiddlewaretoken": token},
    )
    assert logged_in.status_code == 302, logged_in.text[:500]

    for path in ("/p/acme/traces/", f"/p/acme/traces/{trace.pk}/"):
        page = browser.get(path)
        assert page.status_code == 200, path
        _assert_static_files_answer(browser, page)


def test_serve_web_refuses_to_start_naming_collectstatic_when_it_cannot_collect(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    env = {**os.environ, **PRODUCTION_ENV, "DJANGO_STATIC_ROOT": str(not_a_directory / "static")}
    # A subprocess: were the command to start the server instead, the timeout ends it.
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve_web", "--port", str(free_port())],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail("serve_web started without its static files")
    assert process.returncode != 0
    assert "collectstatic --noinput" in output


def test_check_deploy_is_clean_with_the_documented_production_environment():
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO_ROOT,
        env={**os.environ, **PRODUCTION_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
