"""schemathesis against the published OpenAPI document: valid and invalid requests to every
operation, and not one server error."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reviewapp.projects.services import create_api_key, create_project
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 40
TIME_BUDGET_S = 40


def test_no_generated_request_gets_a_server_error(live_server, transactional_db, tmp_path):
    project = create_project(slug="acme")
    _, key = create_api_key(project=project, scopes=["ingest", "review", "admin"])
    # A stored trace, so generated requests about "t-1" reach past the 404.
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    schemathesis = Path(sys.executable).with_name("schemathesis")
    finished = subprocess.run(
        [
            str(schemathesis), "run", f"{live_server.url}/api/v1/openapi.json",
            "--mode", "all",  # positive (valid by the schema) and negative (invalid) requests
            "--checks", "not_a_server_error",
            "--header", f"Authorization: Bearer {key}",
            "--max-examples", str(EXAMPLES_PER_OPERATION),
            "--max-time", str(TIME_BUDGET_S),
            "--phases", "examples,coverage,fuzzing",
            "--workers", "1",
            "--seed", "8",
            "--generation-database", "none",
            "--request-timeout", "30",
            "--report", "ndjson", "--report-dir", str(tmp_path),
            "--no-color",
        ],
        cwd=tmp_path,  # schemathesis keeps a cache folder where it runs
        capture_output=True,
        text=True,
        timeout=TIME_BUDGET_S + 120,
    )  # fmt: skip
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-6000:]
    requests = 0
    for line in next(tmp_path.glob("*.ndjson")).read_text().splitlines():
        event = json.loads(line)
        if "ScenarioFinished" in event:
            recorder = event["ScenarioFinished"].get("recorder") or {}
            requests += len(recorder.get("interactions") or {})
    assert requests > 200  # the run did try the API, not just load the document
