"""Hot-loading an adapter into a real vLLM and routing the gateway's traffic to it."""

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
from django.conf import settings
from django.test import AsyncClient

from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.learning.deploy import deploy_adapter, rollback
from reviewapp.learning.models import Adapter
from reviewapp.projects.services import create_api_key, create_project

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory) -> Path:
    """A freshly initialised LoRA on the bundled model (B = 0, so it answers like the base)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.base_models import resolve_base_model

    model_dir = resolve_base_model(settings.BASE_MODEL, Path(settings.MODEL_CACHE_DIR))
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    lora = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    path = tmp_path_factory.mktemp("adapters") / "adapter"
    lora.save_pretrained(path)
    return path


async def test_a_deployed_adapter_answers_the_gateway_and_rollback_restores_the_base(
    vllm_url, lora_dir
):
    from asgiref.sync import sync_to_async

    project = await sync_to_async(create_project)(
        slug="live", upstream_url=vllm_url, served_model=MODEL
    )
    key = (await sync_to_async(create_api_key)(project=project))[1]
    name = f"live-v1-{lora_dir.stat().st_ino}"  # vLLM keeps names across tests: keep them unique
    adapter = await Adapter.objects.acreate(
        project=project, version=1, name=name, path=str(lora_dir), base_model=MODEL, checksum="c"
    )
    await sync_to_async(deploy_adapter)(adapter=adapter)
    listed = httpx.get(f"{vllm_url}/models").json()["data"]
    assert name in {model["id"] for model in listed}

    async def ask() -> ModelCall:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        response = await AsyncClient().post(
            "/v1/chat/completions",
            orjson.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code == 200
        await asyncio.to_thread(recorder.wait_until_idle, 30)
        return await ModelCall.objects.order_by("-id").afirst()

    call = await ask()
    assert (call.upstream_model, call.adapter_version) == (name, name)
    await sync_to_async(rollback)(adapter=adapter)
    call = await ask()
    assert (call.upstream_model, call.adapter_version) == (MODEL, "")


def test_a_name_loaded_from_another_path_answers_with_the_adapter_deployed_under_it(
    vllm_url, lora_dir, tmp_path
):
    """A model server that outlived the database that named its adapters (or serves a second
    installation) may hold `<slug>-v1` from other files: deploying this installation's `<slug>-v1`
    must load its own, not count the name as loaded."""
    import shutil

    from training.deploy import load_adapter

    other = tmp_path / "other"
    shutil.copytree(lora_dir, other)
    name = f"stale-v1-{other.stat().st_ino}"  # vLLM keeps names across tests: keep them unique
    with httpx.Client(timeout=300) as client:
        load_adapter(client, vllm_url, name=name, path=str(lora_dir))  # the stale one
        load_adapter(client, vllm_url, name=name, path=str(other))
        load_adapter(client, vllm_url, name=name, path=str(other))  # loaded: nothing to do
        served_from = {
            model["id"]: model.get("root")
            for model in client.get(f"{vllm_url}/models").json()["data"]
        }
    assert served_from[name] == str(other)
