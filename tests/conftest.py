import pytest
from django.contrib.auth import get_user_model

from reviewapp import jobs
from reviewapp.gateway import views as gateway_views
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.monitors.refusals import RefusalCounter
from reviewapp.projects.models import Membership
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.factories import ApiClient, make_trace


@pytest.hookimpl(trylast=True)  # after pytest-django's ordering, which the stable sort keeps
def pytest_collection_modifyitems(items):
    """The slow tests last, each group in its own order: bin/test installs vLLM in the
    background meanwhile, and the fast tests report first."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


@pytest.fixture(autouse=True)
def refusals(monkeypatch) -> RefusalCounter:
    """Each test counts the gateway's refusals on a counter of its own that writes only when
    the test flushes it: the process's one writes from a thread every few seconds, into
    whichever test runs then, or during the flush of a live-server test's database, which
    then fails."""
    counter = RefusalCounter(flush_seconds=None)
    monkeypatch.setattr(gateway_views, "refusals", counter)
    return counter


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Users are made with MD5 hashes: the production hasher (PBKDF2, a million rounds) takes
    0.4-0.7 s a user on these machines, minutes over the suite. A test whose password another
    process checks keeps the production hashers (tests/site/test_production_start.py)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class Enqueued(list):
    """The jobs sent through reviewapp.jobs, in order: (task name, args, countdown) each."""

    def of(self, task_name: str) -> list[tuple]:
        """The arguments of each job of that task, in order."""
        return [args for name, args, _ in self if name == task_name]


@pytest.fixture
def enqueued(monkeypatch) -> Enqueued:
    """Jobs are kept here instead of sent to the broker: no worker runs in these tests
    (tests/site/test_jobs.py sends them for real)."""
    sent = Enqueued()

    def enqueue(task_name: str, *args, countdown: float | None = None) -> None:
        sent.append((task_name, args, countdown))

    monkeypatch.setattr(jobs, "enqueue", enqueue)
    return sent


@pytest.fixture
def project(db):
    return create_project(slug="acme", name="Acme support agent")


@pytest.fixture
def other_project(db):
    return create_project(slug="globex", name="Globex")


@pytest.fixture
def api_key(project) -> str:
    """A harness's key: the ingest scope only, as create_api_key makes by default."""
    return create_api_key(project=project)[1]


@pytest.fixture
def admin_api_key(project) -> str:
    """An operator's key with every scope: ingests, reviews over the API, retrains, exports."""
    return create_api_key(project=project, scopes=["ingest", "review", "admin"])[1]


@pytest.fixture
def admin_api(admin_api_key) -> ApiClient:
    return ApiClient(admin_api_key)


@pytest.fixture
def review_api(project) -> ApiClient:
    """A review tool's key: its feedback counts as a reviewer's and its tags join the taxonomy."""
    return ApiClient(create_api_key(project=project, scopes=["ingest", "review"])[1])


@pytest.fixture
def other_api_key(other_project) -> str:
    return create_api_key(project=other_project)[1]


@pytest.fixture
def api(api_key) -> ApiClient:
    return ApiClient(api_key)


@pytest.fixture
def other_api(other_api_key) -> ApiClient:
    return ApiClient(other_api_key)


@pytest.fixture
def other_admin_api(other_project) -> ApiClient:
    return ApiClient(create_api_key(project=other_project, scopes=["admin"])[1])


def make_user(username: str):
    return get_user_model().objects.create_user(username, password="correct horse battery")


@pytest.fixture
def alice(project):
    """An admin of the acme project."""
    user = make_user("alice")
    Membership.objects.create(project=project, user=user, role="admin")
    return user


@pytest.fixture
def bob(project):
    """A reviewer of the acme project."""
    user = make_user("bob")
    Membership.objects.create(project=project, user=user, role="reviewer")
    return user


@pytest.fixture
def victor(project):
    """A viewer of the acme project: reads, never writes."""
    user = make_user("victor")
    Membership.objects.create(project=project, user=user, role="viewer")
    return user


@pytest.fixture
def mallory(other_project):
    """A member of another project only."""
    user = make_user("mallory")
    Membership.objects.create(project=other_project, user=user, role="admin")
    return user


@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory):
    """A real vLLM CPU server with the bundled model. Reuses APPRENTICE_TEST_VLLM_URL when set;
    otherwise installs vLLM into its venv once (minutes) and starts it on a free port."""
    import os
    import subprocess
    from pathlib import Path

    from django.conf import settings

    from tests.fake_upstream import free_port
    from training.base_models import resolve_base_model
    from training.vllm_server import (
        ensure_vllm_venv,
        vllm_command,
        vllm_environment,
        wait_until_ready,
    )

    if os.environ.get("APPRENTICE_TEST_VLLM_URL"):
        yield os.environ["APPRENTICE_TEST_VLLM_URL"].rstrip("/")
        return
    python = ensure_vllm_venv(settings.VLLM_VENV)
    model_dir = resolve_base_model(settings.BASE_MODEL, Path(settings.MODEL_CACHE_DIR))
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with open(log, "w") as log_file:
        process = subprocess.Popen(
            vllm_command(
                python, model_dir=model_dir.resolve(), served_name=settings.BASE_MODEL, port=port
            ),
            env=vllm_environment(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_ready(url, timeout=900, process=process)
    except Exception:
        process.kill()
        raise RuntimeError("vLLM did not start; its log:\n" + log.read_text()[-4000:]) from None
    yield url
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture
def approved_target(project):
    """An approved target on a calculator trace: enough for a run to start."""
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    trace = project.traces.get()
    feedback, _ = record_feedback(trace=trace, text="Lead with the number.", turn=4)
    return DistillationTarget.objects.create(
        feedback=feedback,
        turn=4,
        source="hint",
        student_context=trace.body_json()["messages"][:4],
        target={"role": "assistant", "content": "84."},
        state=TargetState.APPROVED,
    )
