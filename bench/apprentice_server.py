"""Apprentice's web process as the benchmarks start it: production settings, 127.0.0.1 only."""

import os
import socket
import sys

ASGI_APP = "reviewapp.asgi:application"  # what production serves
SERVER_SECRET_KEY = "bench-only-secret-key-not-for-production-0123456789-abcdefghijklmnop"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_environment(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": SERVER_SECRET_KEY,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "WARNING",
    }


def server_command(port: int, workers: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", ASGI_APP,
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
