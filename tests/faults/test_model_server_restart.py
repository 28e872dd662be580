"""A real vLLM restarts after a deploy: it has forgotten every adapter loaded at runtime, yet
harness calls through the project's alias reach the deployed adapter again as soon as it is
back, with no redeploy: vLLM's filesystem resolver loads it from the adapter store by name (and
where a server has no resolver, the gateway loads it again when the server says it does not know
it)."""

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import pytest
from django.conf import settings
from django.test import AsyncClient

from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.learning.deploy import deploy_adapter
from reviewapp.learning.models import Adapter
from reviewapp.projects.services import create_api_key, create_project
from tests.fake_upstream import free_port
from training.base_models import resolve_base_model
from training.vllm_server import ensure_vllm_venv, vllm_command, vllm_environment, wait_until_ready

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MODEL = "SmolLM2-135M-Instruct"
NAME = "restart-v1"


class ModelServer:
    """vLLM CPU on a fixed port, serving the bundled model with the adapter store as its
    resolver directory, as `serve_model` starts it."""

    def __init__(self, adapters_dir: Path, log: Path) -> None:
        self.python = ensure_vllm_venv(settings.VLLM_VENV)
        self.model_dir = resolve_base_model(settings.BASE_MODEL, Path(settings.MODEL_CACHE_DIR))
        self.adapters_dir = adapters_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "a") as log_file:
            self.process = subprocess.Popen(
                vllm_command(
                    self.python,
                    model_dir=self.model_dir.resolve(),
                    served_name=MODEL,
                    port=self.port,
                ),
                env=vllm_environment(adapters_dir=self.adapters_dir),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until_ready(self.url, timeout=900, process=self.process)
        except Exception:
            self.kill()
            raise RuntimeError("vLLM did not start:\n" + self.log.read_text()[-4000:]) from None

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)

    def loaded(self) -> set[str]:
        return {model["id"] for model in httpx.get(f"{self.url}/models").json()["data"]}


@pytest.fixture
def model_server(tmp_path):
    server = ModelServer(tmp_path / "adapters", tmp_path / "vllm.log")
    yield server
    server.kill()


def _write_adapter(adapters_dir: Path, model_dir: Path) -> Path:
    """A freshly initialised LoRA (B = 0) in the store, naming its base as vLLM was given it
    (the resolver's condition), as training/adapters.write_adapter writes a trained one."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    path = adapters_dir / NAME
    get_peft_model(model, LoraConfig(r=8, target_modules="all-linear")).save_pretrained(path)
    config = json.loads((path / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(model_dir.resolve())
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


async def test_a_restarted_model_server_serves_the_deployed_adapter_without_a_redeploy(
    model_server,
):
    from asgiref.sync import sync_to_async

    path = _write_adapter(model_server.adapters_dir, model_server.model_dir)
    await asyncio.to_thread(model_server.start)
    project = await sync_to_async(create_project)(
        slug="restart", upstream_url=model_server.url, served_model=MODEL
    )
    key = (await sync_to_async(create_api_key)(project=project))[1]
    adapter = await Adapter.objects.acreate(
        project=project, version=1, name=NAME, path=str(path), base_model=MODEL, checksum="c"
    )
    await sync_to_async(deploy_adapter)(adapter=adapter)

    async def ask() -> tuple[int, ModelCall | None]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        response = await AsyncClient().post(
            "/v1/chat/completions",
            orjson.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
        await asyncio.to_thread(recorder.wait_until_idle, 30)
        return response.status_code, await ModelCall.objects.order_by("-id").afirst()

    status, call = await ask()
    assert (status, call.upstream_model) == (200, NAME)

    model_server.kill()
    status, _ = await ask()
    assert status == 502  # down: the harness gets an error, not a hang

    await asyncio.to_thread(model_server.start)
    assert NAME not in model_server.loaded()  # runtime-loaded adapters are gone after a restart
    back = time.monotonic()
    status, call = await ask()

    assert (status, call.upstream_model, call.adapter_version) == (200, NAME, NAME)
    assert NAME in model_server.loaded()  # the resolver loaded it from the store, by name
    seconds = time.monotonic() - back
    print(f"first call through the alias after the restart answered in {seconds:.1f} s")
