import json
import stat

import pytest
import torch
from peft import PeftModel

from training.adapters import adapter_checksum, write_adapter
from training.config import TrainingConfig
from training.trainer import add_lora

CONFIG = TrainingConfig(lora_r=4, lora_alpha=8, min_steps=1, save_every_steps=0)


@pytest.fixture
def student(make_tiny_llama):
    model = add_lora(make_tiny_llama(), CONFIG)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # a "trained" adapter: it changes the outputs
    return model


def test_adapter_dir_holds_weights_config_and_lineage(student, tmp_path):
    info = write_adapter(
        student, tmp_path, "acme-v1", CONFIG, target_ids=[3, 5], extra={"run_id": 7}
    )

    assert info.path == tmp_path / "acme-v1"
    assert {path.name for path in info.path.iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
        "training_config.json",
        "lineage.json",
    }
    assert TrainingConfig.from_json((info.path / "training_config.json").read_text()) == CONFIG
    lineage = json.loads((info.path / "lineage.json").read_text())
    assert (lineage["target_ids"], lineage["run_id"], lineage["name"]) == ([3, 5], 7, "acme-v1")
    assert info.checksum == adapter_checksum(info.path)


def test_the_adapter_is_readable_by_model_servers_running_as_another_user(student, tmp_path):
    info = write_adapter(student, tmp_path, "acme-v1", CONFIG, target_ids=[])

    assert stat.S_IMODE(info.path.stat().st_mode) == 0o755
    for path in info.path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_written_adapter_loads_back_with_the_same_outputs(student, make_tiny_llama, tmp_path):
    info = write_adapter(student, tmp_path, "acme-v1", CONFIG, target_ids=[])
    input_ids = torch.tensor([[3, 7, 5, 14, 15, 16]])

    loaded = PeftModel.from_pretrained(make_tiny_llama(), info.path)

    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=input_ids).logits, student(input_ids=input_ids).logits
        )


def test_an_existing_name_is_never_overwritten(student, tmp_path):
    first = write_adapter(student, tmp_path, "acme-v1", CONFIG, target_ids=[1])

    with pytest.raises(FileExistsError, match="acme-v1"):
        write_adapter(student, tmp_path, "acme-v1", TrainingConfig(epochs=9), target_ids=[2])

    assert adapter_checksum(first.path) == first.checksum
    assert sorted(path.name for path in tmp_path.iterdir() if path.name != ".write.lock") == [
        "acme-v1"
    ]


def test_an_empty_dir_of_the_same_name_is_not_replaced(student, tmp_path):
    (tmp_path / "acme-v1").mkdir()

    with pytest.raises(FileExistsError):
        write_adapter(student, tmp_path, "acme-v1", CONFIG, target_ids=[])


def test_a_failed_write_leaves_nothing_behind(student, tmp_path, monkeypatch):
    def save_half_then_crash(directory, **kwargs):
        (directory / "adapter_model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(student, "save_pretrained", save_half_then_crash)

    with pytest.raises(OSError, match="disk full"):
        write_adapter(student, tmp_path, "acme-v1", CONFIG, target_ids=[])

    assert list(tmp_path.iterdir()) == []


def test_checksum_changes_when_a_file_changes(student, tmp_path):
    info = write_adapter(student, tmp_path, "acme-v1", CONFIG, target_ids=[])

    (info.path / "lineage.json").write_text("{}")

    assert adapter_checksum(info.path) != info.checksum


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", ""])
def test_names_that_are_not_plain_dir_names_are_rejected(student, tmp_path, name):
    with pytest.raises(ValueError, match="adapter name"):
        write_adapter(student, tmp_path, name, CONFIG, target_ids=[])
