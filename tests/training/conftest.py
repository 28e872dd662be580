import os

# Tests never download anything; huggingface_hub reads this once, at import.
os.environ["HF_HUB_OFFLINE"] = "1"

from collections.abc import Callable

import pytest
import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TINY_VOCAB_SIZE = 64

# SmolLM2's template shape (ChatML; tool calls ignored), so chat code runs on it unchanged.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The same, but printing tool calls, as tool-aware templates do.
TOOL_CALLS_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ ' call ' + call['function']['name'] + ' ' + (call['function']['arguments'] | tojson) }}"
    "{% endfor %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPECIAL_TOKENS = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>", "<unk>"]
_WORDS = [
    "↵", "system", "user", "assistant", "tool", "you", "are", "a", "helpful", "what", "is", "the",
    "capital", "of", "france", "paris", "rome", "italy", "answer", ":", "?", ".", ",", "hello",
    "hi", "yes", "no", "one", "two", "three", "red", "blue", "green", "sky", "color", "say",
    "always", "begin", "with", "short", "reply", "tool_call", "get_weather", "name", "arguments",
    "city", "call", "feedback", "reviewer", "to", "follow", "in", "your",
]  # fmt: skip


@pytest.fixture
def make_tiny_llama() -> Callable[..., LlamaForCausalLM]:
    """Factory for a tiny random Llama (hidden 32, 2 layers): trainer mechanics in milliseconds."""

    def make(seed: int = 0) -> LlamaForCausalLM:
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=TINY_VOCAB_SIZE,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            # 10x the usual init, so the output layer can express confident predictions and
            # an adapter on the layers below it can move them within a few steps.
            initializer_range=0.2,
        )
        return LlamaForCausalLM(config)

    return make


@pytest.fixture
def make_tiny_tokenizer() -> Callable[..., PreTrainedTokenizerFast]:
    """Factory for a word-level tokenizer over the tiny Llama's 64 ids with a ChatML template.

    Lower-cased words and punctuation runs are tokens; a newline becomes its own token ("↵")
    so the text between turns is visible in ids, as it is with real tokenizers.
    """

    def make(chat_template: str = CHATML_TEMPLATE) -> PreTrainedTokenizerFast:
        vocab = {token: index for index, token in enumerate(_SPECIAL_TOKENS + _WORDS)}
        assert len(vocab) <= TINY_VOCAB_SIZE
        backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
        backend.normalizer = normalizers.Sequence(
            [normalizers.Lowercase(), normalizers.Replace("\n", " ↵ ")]
        )
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token="<s>",
            eos_token="<|im_end|>",
            pad_token="<pad>",
            unk_token="<unk>",
            additional_special_tokens=["<|im_start|>"],
        )
        tokenizer.chat_template = chat_template
        return tokenizer

    return make


@pytest.fixture(scope="session")
def bundled_model_dir():
    """The bundled SmolLM2-135M-Instruct as an HF dir, converted once into the shared cache."""
    from pathlib import Path

    from django.conf import settings

    from training.base_models import resolve_base_model

    return resolve_base_model("SmolLM2-135M-Instruct", Path(settings.MODEL_CACHE_DIR))


# The gate for tests of a run's mechanics on the tiny random model: it fixes nothing, and it
# writes random words, which look garbled or not by chance, so neither condition judges it.
TINY_MODEL_GATE = {"min_fixed_fraction": 0, "max_newly_garbled": 1000}


@pytest.fixture
def tiny_base(tmp_path, make_tiny_llama, make_tiny_tokenizer):
    """A tiny random model and its tokenizer saved as a base model directory."""
    directory = tmp_path / "tiny-base"
    make_tiny_llama().save_pretrained(directory)
    make_tiny_tokenizer().save_pretrained(directory)
    return directory
