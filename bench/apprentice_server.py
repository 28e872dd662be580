"""Apprentice's web process as the benchmarks start it: production settings, 127.0.0.1 only."""

import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

ASGI_APP = "reviewapp.asgi:application"  # what production serves
SERVER_SECRET_KEY = "bench-only-secret-key-not-for-production-0123456789-abcdefghijklmnop"
REPO_ROOT = Path(__file__).resolve().parents[1]
SERVER_STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_server(process: subprocess.Popen) -> None:
    """Ask a server process to stop; kill it when it has not within SERVER_STOP_TIMEOUT_S."""
    process.terminate()
    try:
        process.wait(timeout=SERVER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=SERVER_STOP_TIMEOUT_S)


def server_environment(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": SERVER_SECRET_KEY,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "WARNING",
    }


@functools.cache
def collect_static() -> None:
    """With production settings the web process refuses to start until collectstatic has run
    (reviewapp/static_manifest.py): collect once per process, into STATIC_ROOT as the server's
    environment names it (by default the checkout's staticfiles/, as serve_web does)."""
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=REPO_ROOT,
        env={**os.environ, "DJANGO_DEBUG": "false", "DJANGO_SECRET_KEY": SERVER_SECRET_KEY},
        check=True,
    )


def server_command(port: int, workers: int) -> list[str]:
    """The web process's command line; the static files it needs are collected first."""
    collect_static()
    return [
        sys.executable, "-m", "uvicorn", ASGI_APP,
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
