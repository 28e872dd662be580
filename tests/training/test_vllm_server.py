"""The vLLM command line: tool calls parsed by hermes, and the bundled model's template replaced
by the one the trainer renders with."""

import json
from pathlib import Path

from tests.training.test_chat import SMOLLM2_OWN_TEMPLATE
from training.chat import TOOL_CHAT_TEMPLATE
from training.vllm_server import vllm_command


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
