"""The whole loop with real parts only: PostgreSQL, Redis, a Celery worker, vLLM CPU with the
bundled model, the web process (uvicorn) and the demo agent talking to it through the gateway.

Feedback through the API and the dashboard -> targets on the worker -> Retrain in the dashboard
-> gate -> the adapter is hot-loaded -> the same tasks through the gateway now show the taught
behaviour, and their traces name the adapter -> rollback, and the base behaviour is back.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.urls import reverse
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect

from bench.apprentice_server import collect_static
from reviewapp.harness.agent import EpisodeResult, run_episode
from reviewapp.harness.tasks import TASKS
from reviewapp.harness.tools import ToolEnvironment
from reviewapp.learning.models import ACTIVE_RUN_STATUSES, Adapter, DistillationTarget, TargetState
from reviewapp.projects.services import create_api_key
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.models import Trace
from tests.e2e.conftest import sign_in
from tests.fake_upstream import free_port

# Sequences from 1: the gate's held-out feedback is drawn by id, so the same items are held out
# whichever tests ran before this one.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, reset_sequences=True)]

MODEL = "SmolLM2-135M-Instruct"
FEEDBACK = "Always begin your answer with 'Answer:'."
BEGINS_WITH_ANSWER = r"^\s*Answer:"
TAUGHT_TASKS = TASKS[:12]
CHECK_TASKS = TASKS[12:20]  # never reviewed: the lesson has to carry over to new questions
ACTIVE_STATES = {str(status) for status in ACTIVE_RUN_STATUSES}
RUN_PAGE_WAIT_MS = 60_000
# An episode's budget, its turns batched with the others': 7-12 s each alone on 2 cores.
EPISODE_BUDGET_S = 180
SERVER_SECRET_KEY = "full-loop-test-secret-key-not-for-production-0123456789abcdef"


def _database_url() -> str:
    """The test database, for the processes this test starts."""
    if connection.vendor != "postgresql":
        pytest.fail("the full-loop test needs PostgreSQL (set DATABASE_URL), as production does")
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _environment(tmp_path: Path, vllm_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": SERVER_SECRET_KEY,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DJANGO_SECURE_SSL_REDIRECT": "false",  # plain HTTP on 127.0.0.1, no TLS proxy in front
        "VLLM_URL": vllm_url,
        "ADAPTERS_DIR": str(tmp_path / "adapters"),
        "MODEL_CACHE_DIR": str(Path(settings.MODEL_CACHE_DIR).resolve()),
        "HF_HUB_OFFLINE": "1",
        "LOG_LEVEL": "WARNING",
    }


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def _run_page_status(page) -> tuple[str, int]:
    """The run page's state and progress as its poll last left them.

    Generous waits: in CI the browser shares two cores with vLLM, the worker's training and the
    live server, and a read once waited more than the default 10 s. If the block is gone, say
    what the page shows instead (the poll swaps in whatever its 2xx response holds)."""
    try:
        state = page.locator("#run-state").inner_text(timeout=RUN_PAGE_WAIT_MS)
        percent = page.locator("#run-progress").get_attribute("value", timeout=RUN_PAGE_WAIT_MS)
    except PlaywrightTimeoutError:
        shown = page.locator("body").inner_text(timeout=RUN_PAGE_WAIT_MS)[:2000]
        pytest.fail(f"the run page at {page.url} lost its status block; it shows:\n{shown}")
    return state, int(percent)


@pytest.fixture
def web_and_worker(request, tmp_path, vllm_url) -> Iterator[str]:
    """The web process and a Celery worker on the test database; yields the gateway's base URL.
    Their logs are printed when the test fails, so a failure in CI can be read afterwards."""
    env = _environment(tmp_path, vllm_url)
    # Messages other tests enqueued (for rows long gone) would only delay this test's work.
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "reviewapp", "purge", "-f", "-Q", "default,gpu"],
        env=env,
        check=True,
        capture_output=True,
    )
    port = free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    collect_static()  # production settings: the web process refuses to start without them
    web_command = [sys.executable, "-m", "uvicorn", "reviewapp.asgi:application"]
    web_command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    worker_command = [sys.executable, "-m", "celery", "-A", "reviewapp", "worker"]
    worker_command += ["-Q", "default,gpu", "--pool", "solo", "--loglevel", "INFO"]
    base_url = f"http://127.0.0.1:{port}"
    with open(logs / "web.log", "w") as web_log, open(logs / "worker.log", "w") as worker_log:
        web = subprocess.Popen(web_command, env=env, stdout=web_log, stderr=subprocess.STDOUT)
        worker = subprocess.Popen(
            worker_command, env=env, stdout=worker_log, stderr=subprocess.STDOUT
        )
        failed_before = request.session.testsfailed
        try:
            _wait_for(
                lambda: httpx.get(f"{base_url}/api/v1/openapi.json").status_code == 200,
                60,
                "web process",
            )
            yield f"{base_url}/v1"
        except BaseException:
            _print_logs(logs)
            raise
        else:
            if request.session.testsfailed > failed_before:
                _print_logs(logs)
        finally:
            _stop(web)
            _stop(worker)


def _print_logs(logs: Path) -> None:
    for name in ("web", "worker"):
        print(f"--- {name} log ---\n" + (logs / f"{name}.log").read_text()[-6000:])


def _wait_for(condition, timeout_s: float, what: str, interval_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = condition()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        time.sleep(interval_s)
    pytest.fail(f"waited {timeout_s:.0f} s for {what}")


class _Laps:
    """Seconds since the last lap, printed with what they were spent on."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        print(f"{what}: {now - self.last:.0f} s", flush=True)
        self.last = now


def _episodes(base_url: str, key: str, tasks, label: str) -> list[tuple[str, EpisodeResult]]:
    """One episode a task, all in flight together as a harness's workers run them: vLLM batches
    their turns (12 episodes one after another took 88-143 s of the test here, most of it
    waiting on one reply at a time). Each keeps its own seed and trace id, and so its result."""

    def episode(number: int, task) -> tuple[str, EpisodeResult]:
        trace_id = f"{label}-{number}"
        result = run_episode(
            client,
            base_url=base_url,
            api_key=key,
            model=MODEL,
            task=task,
            env=ToolEnvironment(failure_rate=0.0, seed=number),
            time_budget_s=EPISODE_BUDGET_S,
            max_steps=3,
            trace_id=trace_id,
        )
        return trace_id, result

    with httpx.Client() as client, ThreadPoolExecutor(max_workers=len(tasks)) as pool:
        return list(pool.map(episode, range(len(tasks)), tasks))


def _answers_begin_with_answer(results) -> int:
    return sum(result.answer.lstrip().startswith("Answer:") for _, result in results)


def _adapter_versions(trace_ids: list[str]) -> set[str]:
    """The adapter that answered each trace, once the gateway's recorder has written them all."""
    traces = _wait_for(
        lambda: (
            found
            if len(found := list(Trace.objects.filter(external_id__in=trace_ids))) == len(trace_ids)
            else None
        ),
        120,  # it writes in batches after it answers: seconds apart on a busy machine
        "the gateway to record the traces",
    )
    return {trace.adapter_version for trace in traces}


def _recorded_whole(results) -> None:
    """Wait until the gateway's recorder has written every message of each episode: it records
    after it answers, so on a busy machine feedback on the last turn can come before it."""
    expected = {trace_id: len(result.messages) for trace_id, result in results}
    _wait_for(
        lambda: all(
            Trace.objects.filter(external_id=trace_id, message_count__gte=count).exists()
            for trace_id, count in expected.items()
        ),
        120,
        "the gateway to record every message of the episodes",
    )


def test_feedback_becomes_an_adapter_that_answers_the_harness_and_rollback_restores_the_base(
    web_and_worker, vllm_url, alice, project, page, live_server
):
    # Adapters are named <slug>-v<N>, and the session's vLLM keeps every adapter earlier tests
    # loaded: under the fixture's "acme" this run's acme-v1 would be taken as loaded already
    # and an earlier test's acme-v1 would answer.
    project.slug = "full-loop"
    project.upstream_url = vllm_url
    project.served_model = MODEL
    # Default training and gate settings: the loop must teach a small review batch as it comes.
    project.settings = {"auto_approve": "checks_pass"}
    project.save()
    # The harness and the reviewer's script share it here: the review scope makes its feedback
    # a reviewer's, as when the test writes it in the dashboard.
    key = create_api_key(project=project, scopes=["ingest", "review", "admin"])[1]
    gateway = web_and_worker
    # httpx's default 5 s read timeout once failed a feedback POST in CI, on a machine busy
    # with vLLM, the worker and the browser (0.05-0.3 s each on a quiet one); a reviewer's
    # script would wait longer too.
    api = httpx.Client(
        base_url=gateway.removesuffix("/v1"),
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )

    lap = _Laps()  # where the test's minutes go, printed as it goes for reading a CI log
    # 1. The agent works through the gateway on the base model.
    before = _episodes(gateway, key, TAUGHT_TASKS, "before")
    assert _answers_begin_with_answer(before) == 0
    assert _adapter_versions([trace_id for trace_id, _ in before]) == {""}
    _recorded_whole(before)
    lap("episodes on the base")

    # 2. Feedback on each final answer: two in the dashboard (a browser), where the reviewer
    # also writes the corrected reply, then the rest through the API. In that order the
    # teacher is shown both corrections as worked examples for every item it revises, rather
    # than as many as the browser had saved by then (its samples are seeded: the targets, and
    # so the run, are the same each time).
    by_api, by_dashboard = before[:10], before[10:]
    sign_in(page.context, alice, live_server)
    for trace_id, result in by_dashboard:
        trace = Trace.objects.get(project=project, external_id=trace_id)
        page.goto(reverse("trace_detail", args=[project.slug, trace.pk]))
        form = page.locator("#feedback-form")
        form.locator("select[name=anchor]").select_option(f"turn:{len(result.messages) - 1}")
        form.locator("textarea[name=text]").fill(FEEDBACK)
        form.locator("summary").click()
        form.locator("textarea[name=correction_text]").fill(f"Answer: {result.answer.strip()}")
        form.locator("input[name=check_regex]").fill(BEGINS_WITH_ANSWER)
        form.get_by_role("button", name="Save feedback").click()
        expect(page.locator("#feedback-panel article.feedback")).to_have_count(1)
    for trace_id, result in by_api:
        response = api.post(
            f"/api/v1/traces/{trace_id}/feedback",
            json={
                "text": FEEDBACK,
                "turn": len(result.messages) - 1,
                "author": "support-lead",
                "checks": [{"kind": "regex", "value": BEGINS_WITH_ANSWER}],
            },
        )
        assert response.status_code == 201, response.text
    lap("feedback")

    # 3. The worker turns feedback into targets (vLLM as teacher); the best passing one is
    # approved, and feedback no revision followed is marked failed (write a correction).
    _wait_for(
        lambda: (
            not Feedback.objects.filter(trace__project=project, status=FeedbackStatus.OPEN).exists()
        ),
        300,
        "targets (or a failure) for every feedback item",
        interval_s=3,
    )
    approved = DistillationTarget.objects.filter(
        feedback__trace__project=project, state=TargetState.APPROVED
    )
    assert approved.filter(source="correction").count() == 2
    assert approved.count() >= 6
    lap("targets")

    # 4. Retrain, clicked in the browser; the run page's progress bar follows the worker as it
    # trains, evaluates, gates and deploys.
    page.goto(reverse("retrain", args=[project.slug]))
    page.click("#retrain-button")
    page.wait_for_url("**/runs/*/")
    started = time.monotonic()
    states, percents = [], set()
    while time.monotonic() - started < 1200:
        state, percent = _run_page_status(page)
        if not states or states[-1] != state:
            states.append(state)
        percents.add(percent)
        if state not in ACTIVE_STATES:
            break
        time.sleep(1)
    run = project.runs.get()
    lap("retrain")
    print(
        f"\nrun {run.status} after {time.monotonic() - started:.0f} s, page showed {states}, "
        f"progress {sorted(percents)}; gate: {run.metrics.get('gate')}; "
        f"train: {run.metrics.get('train')}; phases (s): {run.metrics.get('phase_seconds')}; "
        f"replies: {run.metrics.get('evaluated_on')}"
    )
    for candidate in run.metrics.get("candidates") or []:  # each adapter the gate weighed
        print(f"candidate step {candidate['step']}: passed {candidate['passed']}, "
              f"{candidate['reason']}")  # fmt: skip
    for item in (run.metrics.get("regression") or {}).get("items") or []:
        if item.get("status") == "regressed":  # what a failed gate broke, for reading a CI log
            print(f"regressed: {item.get('prompt')!r}: {item.get('before', {}).get('reply')!r}"
                  f" -> {item.get('after', {}).get('reply')!r}")  # fmt: skip
    assert states[-1] == "deployed", run.error
    assert "training" in states and "evaluating" in states  # the page updated as it went
    assert percents - {0, 100}, "the progress bar never showed a step in between"
    assert page.locator("#run-progress").get_attribute("value") == "100"
    adapter = Adapter.objects.get(run=run)
    assert run.metrics["gate"]["passed"]

    # 5. The same kind of tasks, new questions, through the gateway: the adapter answers them.
    time.sleep(2.5)  # the gateway caches routes for 2 s
    after = _episodes(gateway, key, CHECK_TASKS, "after")
    taught = _answers_begin_with_answer(after)
    lap("episodes on the adapter")
    print(f"answers beginning with 'Answer:': before 0/{len(before)}, after {taught}/{len(after)}")
    assert taught >= len(after) * 3 // 4
    assert _adapter_versions([trace_id for trace_id, _ in after]) == {adapter.name}

    # 6. Rollback from the adapter's page, and the base answers again.
    page.click("#run-adapter")
    page.click("#rollback")
    expect(page.locator("#deployment-state")).to_have_text("not serving")
    time.sleep(2.5)
    rolled_back = _episodes(gateway, key, CHECK_TASKS[:4], "rolled-back")
    lap("rollback")
    assert _answers_begin_with_answer(rolled_back) == 0
    assert _adapter_versions([trace_id for trace_id, _ in rolled_back]) == {""}
