"""bin/run's start order and messages, run for real with its programs replaced by stubs that
record when they start: the web process answers before vLLM is prepared, and the installer's
output goes to a log file, not the terminal."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLER_NOISE = "Collecting vllm==0.0 (from -r requirements) Downloading 400 MB"

PYTHON_STUB = f"""#!/usr/bin/env bash
echo "python $*" >> "$EVENTS"
case "$*" in
  *--prepare-only*) echo "{INSTALLER_NOISE}"; sleep 1 ;;
  *serve_model*) sleep 1 ;;  # the model server stops at once, which ends bin/run
  -c*) exit 1 ;;
esac
"""
SERVICE_STUB = """#!/usr/bin/env bash
echo "$(basename "$0")" >> "$EVENTS"
exec sleep 30
"""


def run_bin_run(tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / "bin").mkdir()
    shutil.copy(ROOT / "bin" / "run", tmp_path / "bin" / "run")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (tmp_path / "bin" / "_venv.sh").write_text(f'export PATH="{stubs}:$PATH"\n')
    for name, text in (
        ("python", PYTHON_STUB),
        ("celery", SERVICE_STUB),
        ("uvicorn", SERVICE_STUB),
    ):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    events = tmp_path / "events"
    environment = {key: value for key, value in os.environ.items() if key != "VLLM_URL"}
    finished = subprocess.run(
        ["bash", str(tmp_path / "bin" / "run")],
        env={**environment, "EVENTS": str(events)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return finished, events.read_text().splitlines()


def test_the_web_starts_before_vllm_is_prepared_and_the_installer_writes_to_a_log(tmp_path):
    finished, events = run_bin_run(tmp_path)

    # All three run in the background, so the order their stubs write in is the machine's; the
    # order bin/run launched them in is the order of its own messages (the last assert).
    assert {"uvicorn", "celery"} <= set(events)
    assert any("--prepare-only" in event for event in events)
    assert INSTALLER_NOISE not in finished.stdout + finished.stderr
    assert INSTALLER_NOISE in (tmp_path / "var" / "vllm-install.log").read_text()
    assert "about 5 minutes" in finished.stdout and "var/vllm-install.log" in finished.stdout
    assert finished.stdout.index("Apprentice is up") < finished.stdout.index("preparing vLLM")
