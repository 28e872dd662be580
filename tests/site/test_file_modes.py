"""What the embedded run writes under var/ is readable by its user only: the generated admin
password and demo API key, the SQLite database with its -wal and -shm files, and whatever
bin/run's processes create there."""

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.site.test_bin_run import run_bin_run

REPO_ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask():
    """The umask most machines have (files 0644): the modes must not depend on it."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_seed_demo_writes_the_password_and_the_api_key_0600(db, settings, tmp_path, loose_umask):
    settings.VAR_DIR = tmp_path

    call_command("seed_demo", "--traces", "10")

    assert mode(tmp_path / "admin-password") == 0o600
    assert mode(tmp_path / "demo-api-key") == 0o600


def test_seed_demo_makes_secrets_an_earlier_version_wrote_0644_private(
    db, settings, tmp_path, loose_umask
):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", "--traces", "10")
    for name in ("admin-password", "demo-api-key"):
        os.chmod(tmp_path / name, 0o644)

    call_command("seed_demo", "--traces", "10")

    assert mode(tmp_path / "admin-password") == 0o600
    assert mode(tmp_path / "demo-api-key") == 0o600


def migrate_sqlite(var_dir: Path) -> None:
    """`manage.py migrate` on the embedded default (SQLite under var/), with a 022 umask."""
    environment = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    migrated = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=REPO_ROOT,
        env={**environment, "APPRENTICE_VAR_DIR": str(var_dir), "CELERY_BROKER_URL": "memory://"},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert migrated.returncode == 0, migrated.stderr


def test_migrate_makes_the_sqlite_database_and_its_wal_files_0600(tmp_path):
    database = tmp_path / "apprentice.sqlite3"

    migrate_sqlite(tmp_path)

    assert mode(database) == 0o600
    # SQLite creates the write-ahead log and its index with the database file's mode.
    connection = sqlite3.connect(database)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("CREATE TABLE written_after (id INTEGER)")
        assert mode(Path(f"{database}-wal")) == 0o600
        assert mode(Path(f"{database}-shm")) == 0o600
    finally:
        connection.close()


def test_migrate_makes_a_database_an_earlier_version_left_0644_private(tmp_path):
    migrate_sqlite(tmp_path)
    os.chmod(tmp_path / "apprentice.sqlite3", 0o644)

    migrate_sqlite(tmp_path)

    assert mode(tmp_path / "apprentice.sqlite3") == 0o600


def test_bin_run_creates_var_and_what_it_writes_there_private(tmp_path, loose_umask):
    run_bin_run(tmp_path)

    assert mode(tmp_path / "var") == 0o700
    assert mode(tmp_path / "var" / "vllm-install.log") == 0o600
