"""Real processes for the fault tests, each started and killed here.

PostgreSQL and Redis are private instances on free ports (the machine's shared ones are never
touched), so a test may restart them. The web process runs under uvicorn with production
settings, as bench/apprentice_server.py starts it; the worker is a real Celery worker.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from psycopg import sql

from bench.apprentice_server import SERVER_SECRET_KEY, free_port, server_command
from reviewapp.learning.models import ACTIVE_RUN_STATUSES
from tests.training.conftest import (  # noqa: F401
    TINY_MODEL_GATE,
    make_tiny_llama,
    make_tiny_tokenizer,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_DATABASE = "faults_template"
START_TIMEOUT_S = 60.0
PROJECT_SLUG = "acme"
# The project's served model name (the default alias): the only model its gateway forwards.
PROJECT_MODEL = "SmolLM2-135M-Instruct"


def wait_for(condition, *, timeout: float, what: str, interval: float = 0.05):
    """Poll `condition` until it returns something truthy; fail the test naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _log_tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
    """Stop a process we started (and its children: it leads its own session)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)


class PrivatePostgres:
    """A throwaway cluster from the machine's binaries; run as `postgres` when we are root."""

    def __init__(self) -> None:
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        if not binaries or not shutil.which("redis-server"):
            raise RuntimeError(
                "the fault tests start their own PostgreSQL and Redis: install the server "
                "packages (postgresql, redis-server); nothing needs to be running"
            )
        self.bin = binaries[-1]
        self.root = Path(tempfile.mkdtemp(prefix="apprentice-faults-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """`immediate` is a crash: backends die without a checkpoint, as on SIGKILL."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def execute(self, statement, database: str = "postgres") -> None:
        with psycopg.connect(self.url(database), autocommit=True) as connection:
            connection.execute(statement)

    def cleanup(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """redis-server on a free port, with an append-only file as a production broker has."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="apprentice-faults-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        wait_for(self._answers, timeout=START_TIMEOUT_S, what="redis-server to answer")

    def _answers(self) -> bool:
        try:
            return redis.Redis(port=self.port, socket_timeout=1).ping()
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        assert self.process is not None
        _stop(self.process, signal.SIGKILL)

    def cleanup(self) -> None:
        if self.process is not None:
            _stop(self.process)
        shutil.rmtree(self.root, ignore_errors=True)


def _service_environment(database_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "reviewapp.settings",
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker_url,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": SERVER_SECRET_KEY,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        # The clients here talk plain HTTP to 127.0.0.1, as a TLS proxy in front would.
        "DJANGO_SECURE_SSL_REDIRECT": "false",
        "HF_HUB_OFFLINE": "1",
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(REPO_ROOT),
        **extra,
    }


class ManagedProcess:
    """A web process or worker: its own session, its log in a file, killable on purpose."""

    def __init__(self, command: list[str], environment: dict[str, str], log: Path) -> None:
        self.command, self.environment, self.log = command, environment, log
        self.process: subprocess.Popen | None = None

    def start(self) -> "ManagedProcess":
        with open(self.log, "a") as log_file:
            self.process = subprocess.Popen(
                self.command,
                cwd=REPO_ROOT,
                env=self.environment,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.pid:
                pids.append(int(stat.parent.name))
        return pids

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, no acknowledgements, no goodbyes."""
        if self.process is not None:
            _stop(self.process, signal.SIGKILL)

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)

    def tail(self, chars: int = 4000) -> str:
        return _log_tail(self.log, chars)


class WebProcess(ManagedProcess):
    def __init__(self, environment: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(server_command(self.port, workers=1), environment, log)

    def start(self) -> "WebProcess":
        super().start()
        wait_for(self._answers, timeout=START_TIMEOUT_S, what=f"the web process; log:\n{self.log}")
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError("the web process exited:\n" + self.tail())
        try:
            return httpx.get(f"{self.url}/api/v1/openapi.json", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


class WorkerProcess(ManagedProcess):
    def __init__(self, environment: dict[str, str], log: Path, name: str) -> None:
        command = [
            sys.executable, "-m", "celery", "-A", "reviewapp", "worker",
            "-Q", "default,gpu", "--concurrency", "1", "--pool", "prefork",
            "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO",
        ]  # fmt: skip
        super().__init__(command, environment, log)

    def start(self) -> "WorkerProcess":
        super().start()
        wait_for(
            lambda: "ready." in self.tail(100_000) or self._exited(),
            timeout=START_TIMEOUT_S,
            what="the Celery worker",
        )
        return self

    def _exited(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError("the worker exited:\n" + self.tail())
        return False


class UpstreamProcess(ManagedProcess):
    """tests/faults/upstream.py: the FAKE model server, in a process a test may kill."""

    def __init__(self, environment: dict[str, str], log: Path, *options: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        command = [sys.executable, "-m", "tests.faults.upstream", str(self.port), *options]
        super().__init__(command, environment, log)

    def start(self) -> "UpstreamProcess":
        super().start()
        wait_for(self._answers, timeout=START_TIMEOUT_S, what="the fake upstream")
        return self

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


class Stack:
    """One test's database, broker, and the processes pointed at them."""

    def __init__(self, postgres: PrivatePostgres, redis: PrivateRedis, root: Path, name: str):
        self.postgres, self.redis, self.root, self.name = postgres, redis, root, name
        self.database_url = postgres.url(name)
        self.processes: list[ManagedProcess] = []
        self.extra_environment: dict[str, str] = {
            "ADAPTERS_DIR": str(root / "adapters"),
            "MODEL_CACHE_DIR": str(root / "models"),
            "APPRENTICE_VAR_DIR": str(root / "var"),
        }

    def environment(self, **extra: str) -> dict[str, str]:
        return _service_environment(
            self.database_url, self.redis.url, **self.extra_environment, **extra
        )

    def web(self, **extra: str) -> WebProcess:
        log = self.root / f"web-{len(self.processes)}.log"
        process = WebProcess(self.environment(**extra), log)
        self.processes.append(process)
        return process.start()

    def worker(self, **extra: str) -> WorkerProcess:
        name = f"{self.name}-{len(self.processes)}"
        process = WorkerProcess(self.environment(**extra), self.root / f"{name}.log", name)
        self.processes.append(process)
        return process.start()

    def upstream(self, *options: str) -> UpstreamProcess:
        """Options as tests/faults/upstream.py takes them, e.g. "--die-on", "/load_lora_adapter"."""
        log = self.root / f"upstream-{len(self.processes)}.log"
        process = UpstreamProcess(self.environment(), log, *options)
        self.processes.append(process)
        return process.start()

    def query(self, statement: str, *params) -> list[tuple]:
        with psycopg.connect(self.database_url, autocommit=True) as connection:
            return connection.execute(statement, params).fetchall()

    def execute(self, statement: str, *params) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as connection:
            connection.execute(statement, params)

    def scalar(self, statement: str, *params):
        return self.query(statement, *params)[0][0]

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


CONVERSATION = [
    {"role": "user", "content": "what is the capital of france ?"},
    {"role": "assistant", "content": "rome"},
]


def use_tiny_base(
    stack,
    make_llama,
    make_tokenizer,
    *,
    epochs=2,
    min_steps=1,
    auto_deploy=False,
    save_every_steps=0,
) -> None:
    """Train the tiny random model of tests/training (seconds, not minutes) in this project."""
    directory = stack.root / "tiny-base"
    make_llama().save_pretrained(directory)
    make_tokenizer().save_pretrained(directory)
    policy = {
        "training": {
            "epochs": epochs,
            # `epochs` passes over the one example, or more to make `min_steps` updates.
            "min_steps": min_steps,
            "per_device_batch_size": 1,
            "max_seq_len": 64,
            "save_every_steps": save_every_steps,
        },
        "gate": TINY_MODEL_GATE,
        "auto_deploy": auto_deploy,
    }
    stack.execute(
        "UPDATE reviewapp_project SET base_model = %s, settings = %s",
        str(directory),
        json.dumps(policy),
    )


def approve_a_correction(stack, web, headers, external_id: str = "t") -> None:
    """A trace and a reviewer's correction of its answer; the worker turns it into a target."""
    api = f"{web.url}/api/v1/traces"
    trace = {"external_id": external_id, "messages": CONVERSATION}
    assert httpx.post(api, json={"traces": [trace]}, headers=headers).status_code == 207
    feedback = {
        "text": "say paris",
        "turn": 1,
        "correction": {"role": "assistant", "content": "paris"},
    }
    response = httpx.post(f"{api}/{external_id}/feedback", json=feedback, headers=headers)
    assert response.status_code == 201, response.text
    wait_for(
        lambda: stack.scalar("SELECT count(*) FROM reviewapp_distillationtarget"),
        timeout=60,
        what="the worker to store the correction as a target",
    )


def finished_run(web, headers, run_id: int) -> dict | None:
    """The run as the API shows it once it is over; None while it is active."""
    run = httpx.get(f"{web.url}/api/v1/runs/{run_id}", headers=headers).json()
    return None if run["status"] in ACTIVE_RUN_STATUSES else run


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    postgres = PrivatePostgres()
    try:
        postgres.init()
        postgres.start()
        yield postgres
    finally:
        postgres.cleanup()


@pytest.fixture(scope="session")
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def project_key(private_postgres) -> str:
    """Migrate a template database once, with project `acme` and a key; returns the secret."""
    private_postgres.execute(
        sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DATABASE))
    )
    environment = _service_environment(private_postgres.url(TEMPLATE_DATABASE), "memory://")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=REPO_ROOT, env=environment, check=True, timeout=300,
    )  # fmt: skip
    created = subprocess.run(
        [sys.executable, "-c",
         "import django; django.setup()\n"
         "from reviewapp.projects.services import create_api_key, create_project\n"
         f"print(create_api_key(project=create_project(slug='{PROJECT_SLUG}'), "
         "scopes=['ingest', 'review', 'admin'])[1])"],  # a reviewer's corrections too
        cwd=REPO_ROOT, env=environment, check=True, timeout=120, capture_output=True, text=True,
    )  # fmt: skip
    return created.stdout.strip().splitlines()[-1]


@pytest.fixture
def stack(request, private_postgres, private_redis, project_key) -> Iterator[Stack]:
    """A fresh copy of the template database; the processes a test starts are stopped after."""
    name = "faults_" + request.node.name.lower()[:40].replace("-", "_").replace("[", "_")
    name = "".join(c for c in name if c.isalnum() or c == "_")
    private_postgres.execute(
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )
    private_postgres.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(TEMPLATE_DATABASE)
        )
    )
    redis.Redis(port=private_redis.port).flushall()
    root = Path(tempfile.mkdtemp(prefix=f"apprentice-{name}-"))
    stack = Stack(private_postgres, private_redis, root, name)
    try:
        yield stack
    finally:
        stack.stop()
        for process in stack.processes:  # pytest shows this only when the test failed
            print(f"--- {process.log.name}\n{process.tail()}")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def headers(project_key) -> dict[str, str]:
    return {"Authorization": f"Bearer {project_key}"}
