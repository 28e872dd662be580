"""What lets a restarted vLLM (or a new replica) serve a deployed adapter without a redeploy:
vLLM's filesystem resolver over the adapter store, and adapter dirs that satisfy it."""

import json
from pathlib import Path

from transformers import LlamaForCausalLM

from training.adapters import write_adapter
from training.config import TrainingConfig
from training.trainer import add_lora
from training.vllm_server import vllm_command, vllm_environment

CONFIG = TrainingConfig(lora_r=4, lora_alpha=8, min_steps=1, save_every_steps=0)


def test_the_model_server_resolves_unknown_adapters_from_the_adapter_store(tmp_path):
    env = vllm_environment(adapters_dir=tmp_path)
    assert env["VLLM_PLUGINS"] == "lora_filesystem_resolver"
    assert env["VLLM_LORA_RESOLVER_CACHE_DIR"] == str(tmp_path)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"  # the resolver needs it on


def test_an_adapter_names_its_base_as_the_model_server_was_given_it(make_tiny_llama, tmp_path):
    # The resolver loads an adapter only if adapter_config.json's base_model_name_or_path is
    # the --model vLLM serves; the base here is reached through a symlink, as a mounted store is.
    make_tiny_llama().save_pretrained(tmp_path / "store" / "base")
    (tmp_path / "models").symlink_to(tmp_path / "store")
    model_dir = tmp_path / "models" / "base"
    student = add_lora(LlamaForCausalLM.from_pretrained(model_dir), CONFIG)

    info = write_adapter(student, tmp_path / "adapters", "acme-v1", CONFIG, target_ids=[])

    served = vllm_command(Path("python"), model_dir=model_dir.resolve(), served_name="b", port=1)
    adapter_config = json.loads((info.path / "adapter_config.json").read_text())
    assert adapter_config["peft_type"] == "LORA"
    assert adapter_config["base_model_name_or_path"] == served[served.index("--model") + 1]
