import threading
import time
from pathlib import Path

import pytest

from training import base_models
from training.base_models import resolve_base_model

BUNDLED = "SmolLM2-135M-Instruct"


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Replace the real (20 s) conversion with one that writes a marker and records its call."""
    calls: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        time.sleep(0.05)  # long enough for concurrent callers to overlap
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(base_models, "_convert_gguf_to_hf", fake_convert)
    return calls


def test_existing_directory_is_used_as_is(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()

    assert resolve_base_model(str(model_dir), tmp_path / "cache") == model_dir


def test_unknown_name_is_rejected_naming_the_known_models(tmp_path):
    with pytest.raises(ValueError, match="SmolLM2-135M-Instruct"):
        resolve_base_model("gpt-17", tmp_path)


def test_bundled_model_is_converted_into_the_cache(tmp_path, conversions):
    model_dir = resolve_base_model(BUNDLED, tmp_path)

    assert model_dir == tmp_path / BUNDLED
    assert (model_dir / "config.json").exists()
    assert len(conversions) == 1


def test_second_resolve_reuses_the_converted_dir(tmp_path, conversions):
    resolve_base_model(BUNDLED, tmp_path)
    resolve_base_model(BUNDLED, tmp_path)

    assert len(conversions) == 1


def test_concurrent_resolves_convert_once(tmp_path, conversions):
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve_base_model(BUNDLED, tmp_path)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [tmp_path / BUNDLED] * 4
    assert len(conversions) == 1


def test_failed_conversion_leaves_no_model_dir(tmp_path, monkeypatch):
    def crash(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_text("half")
        raise RuntimeError("out of disk")

    monkeypatch.setattr(base_models, "_convert_gguf_to_hf", crash)

    with pytest.raises(RuntimeError, match="out of disk"):
        resolve_base_model(BUNDLED, tmp_path)

    assert sorted(path.name for path in tmp_path.iterdir()) == [f".{BUNDLED}.lock"]


def test_partial_dir_left_by_a_killed_conversion_is_cleaned_up(tmp_path, conversions):
    stale = tmp_path / f".{BUNDLED}.partial-abc123"
    stale.mkdir()
    (stale / "model.safetensors").write_text("half")

    resolve_base_model(BUNDLED, tmp_path)

    assert not stale.exists()
