import os

# Tests never download anything; huggingface_hub reads this once, at import.
os.environ["HF_HUB_OFFLINE"] = "1"

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture
def make_tiny_llama() -> Callable[..., LlamaForCausalLM]:
    """Factory for a tiny random Llama (hidden 32, 2 layers): trainer mechanics in milliseconds."""

    def make(seed: int = 0) -> LlamaForCausalLM:
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        return LlamaForCausalLM(config)

    return make
