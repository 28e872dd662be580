"""The whole product as the loop benchmarks run it: a scratch database, the web process
(production settings) and one Celery worker on both queues, a project whose alias the gateway
routes to vLLM, and an API key with every scope. Everything listens on 127.0.0.1."""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from apprentice_server import REPO_ROOT, free_port, server_command, server_environment, stop_server
from scratch_db import scratch_database

MODEL = "SmolLM2-135M-Instruct"  # the upstream's served name
PROXY_HEADERS = {"X-Forwarded-Proto": "https"}  # DEBUG off redirects plain HTTP otherwise
WEB_START_TIMEOUT_S = 60.0


def add_product_arguments(parser: argparse.ArgumentParser) -> None:
    """The options running_product needs: where vLLM, Redis and PostgreSQL are."""
    parser.add_argument("--vllm-url", default="http://127.0.0.1:8100/v1")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
        help="a database on a server where the user may CREATE DATABASE (the scratch one)",
    )


@dataclass
class Product:
    api: httpx.Client  # the project's key, every scope
    root: str  # http://127.0.0.1:<port>
    key: str
    adapters_dir: Path
    env: dict  # the environment its processes run in (its database, broker, model server)
    # The project's slug, from the scratch database's name: the adapters of two benches sharing
    # one vLLM are named after their projects (<slug>-v1), so they must not collide.
    slug: str

    @property
    def gateway(self) -> str:
        return f"{self.root}/v1"


@contextmanager
def running_product(
    *, admin_url: str, database: str, vllm_url: str, redis_url: str, alias: str
) -> Iterator[Product]:
    """The product for the block; its processes are stopped and its database dropped after."""
    httpx.get(f"{vllm_url}/models", timeout=5).raise_for_status()
    database_url = admin_url.rsplit("/", 1)[0] + f"/{database}"
    adapters_dir = Path(tempfile.mkdtemp(prefix=f"bench-{database}-adapters-"))
    env = {
        **server_environment(database_url),
        "CELERY_BROKER_URL": redis_url,
        "VLLM_URL": vllm_url,
        "ADAPTERS_DIR": str(adapters_dir),
        "HF_HUB_OFFLINE": "1",
    }
    processes: list[subprocess.Popen] = []
    with scratch_database(admin_url, database):
        try:
            manage = [sys.executable, "manage.py"]
            subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True, cwd=REPO_ROOT)
            subprocess.run(
                [sys.executable, "-m", "celery", "-A", "reviewapp", "purge", "-f",
                 "-Q", "default,gpu"],
                env=env, check=True, cwd=REPO_ROOT, capture_output=True,
            )  # fmt: skip
            slug = database.removeprefix("apprentice_").replace("_", "-")
            key = _make_project(env, vllm_url, alias, slug)
            port = free_port()
            processes.append(subprocess.Popen(server_command(port, 1), env=env, cwd=REPO_ROOT))
            worker = [sys.executable, "-m", "celery", "-A", "reviewapp", "worker", "-Q",
                      "default,gpu", "--pool", "solo", "--loglevel", "WARNING"]  # fmt: skip
            processes.append(subprocess.Popen(worker, env=env, cwd=REPO_ROOT))
            root = f"http://127.0.0.1:{port}"
            headers = {"Authorization": f"Bearer {key}", **PROXY_HEADERS}
            with httpx.Client(base_url=root, headers=headers, timeout=60) as api:
                wait_for(
                    lambda: api.get("/api/v1/openapi.json").status_code == 200,
                    WEB_START_TIMEOUT_S,
                    "the web process",
                )
                yield Product(api, root, key, adapters_dir, env, slug)
        finally:
            for process in processes:
                stop_server(process)


def _make_project(env: dict, vllm_url: str, alias: str, slug: str) -> str:
    """The project, through the same commands an operator uses; returns the API key."""
    run = {"env": env, "check": True, "cwd": REPO_ROOT, "capture_output": True, "text": True}
    manage = [sys.executable, "manage.py"]
    subprocess.run(
        [*manage, "create_project", slug, "--upstream", vllm_url, "--model", alias], **run
    )
    # Default training settings, as the full-loop test and a new project have.
    settings_code = (
        f"from reviewapp.projects.models import Project; p = Project.objects.get(slug={slug!r}); "
        f"p.upstream_model = {MODEL!r}; p.save()"
    )
    subprocess.run([*manage, "shell", "-c", settings_code], **run)
    # One key for the harness's calls, the reviewers' feedback and corrections and the Retrain
    # click, which only review and admin keys may make.
    scopes = ["--scope", "ingest", "--scope", "review", "--scope", "admin"]
    output = subprocess.run([*manage, "create_api_key", slug, *scopes], **run).stdout
    return next(word for word in output.split() if len(word) > 30)


def screenshot(product: Product, path: str, page_of_project: str, element: str = "") -> None:
    """A full-page screenshot of one dashboard page (or of its `element`, a CSS selector) as a
    project admin sees it (Debian's chromium, as the browser tests use; Playwright is a dev
    dependency). The admin's session is made on the server, as the browser tests make theirs:
    the production settings' CSRF check refuses a login form posted over plain HTTP."""
    from playwright.sync_api import sync_playwright

    code = (
        "from django.conf import settings; from django.contrib.auth.models import User; "
        "from django.test import Client; "
        "from reviewapp.projects.models import Membership, Project, Role; "
        "user, _ = User.objects.get_or_create(username='bench-admin'); "
        f"Membership.objects.get_or_create(project=Project.objects.get(slug={product.slug!r}), "
        "user=user, "
        "defaults={'role': Role.ADMIN}); "
        "client = Client(); client.force_login(user); "
        "print(settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)"
    )
    output = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        env=product.env, check=True, cwd=REPO_ROOT, capture_output=True, text=True,
    ).stdout  # fmt: skip
    name, value = output.split()[-2:]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--headless", "--no-sandbox"]
        )
        context = browser.new_context(
            viewport={"width": 1440, "height": 900}, extra_http_headers=PROXY_HEADERS
        )
        context.add_cookies([{"name": name, "value": value, "url": product.root}])
        page = context.new_page()
        page.goto(f"{product.root}/p/{product.slug}/{page_of_project}/")
        if element:
            page.locator(element).screenshot(path=path)
        else:
            page.screenshot(path=path, full_page=True)
        browser.close()


def wait_for(condition: Callable, timeout_s: float, what: str):
    """The condition's first truthy result, polled every half second; an HTTP error counts as
    not yet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = condition()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        time.sleep(0.5)
    raise SystemExit(f"gave up after {timeout_s:.0f} s waiting for {what}")


def run_to_the_end(
    api: httpx.Client, body: dict, max_seconds: float
) -> tuple[dict, dict[str, float], float]:
    """Start a retrain as the Retrain button does and follow it: (the run as it ended, the
    seconds after the click each status was first seen, the click's monotonic time)."""
    clicked = time.monotonic()
    response = api.post("/api/v1/runs", json=body)
    response.raise_for_status()
    run_id = response.json()["id"]
    timeline: dict[str, float] = {}
    run = {"status": "queued"}
    while time.monotonic() - clicked < max_seconds:
        try:
            run = api.get(f"/api/v1/runs/{run_id}").json()
        except httpx.TimeoutException:  # a web process starved by training: ask again
            continue
        timeline.setdefault(run["status"], time.monotonic() - clicked)
        if run["status"] not in ("queued", "building", "training", "evaluating", "deploying"):
            return run, timeline, clicked
        time.sleep(0.5)
    raise SystemExit(f"run {run_id} still {run['status']} after {max_seconds:.0f} s")
