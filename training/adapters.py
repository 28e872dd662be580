"""Trained adapters as immutable, checksummed directories (`<root>/<project>-v<N>`).

vLLM refuses to reload a name it has loaded, and a rollback must find the old files unchanged,
so a name is written once: into a temp dir beside the destination, then renamed into place.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock
from peft import PeftModel

from training.config import TrainingConfig

_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class AdapterInfo:
    path: Path
    checksum: str  # sha256 over every file in the dir, see adapter_checksum


def write_adapter(
    model: PeftModel,
    dest_root: Path,
    name: str,
    config: TrainingConfig,
    target_ids: list[int],
    extra: dict[str, Any] | None = None,
) -> AdapterInfo:
    """Write the adapter, its training config and lineage to `dest_root/name`, all or nothing.

    Raises FileExistsError if the name is taken: adapter dirs are never overwritten.
    """
    if not _ADAPTER_NAME.fullmatch(name):
        raise ValueError(f"adapter name {name!r} must be letters, digits, '.', '_' or '-'")
    destination = dest_root / name
    if destination.exists():  # checked again under the lock; this one only saves the work
        raise FileExistsError(f"adapter {name!r} already exists in {dest_root}")
    dest_root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=dest_root, prefix=f".{name}.partial-"))
    try:
        model.save_pretrained(partial)
        # vLLM's filesystem resolver (a restarted server loading a deployed adapter by name) takes
        # it only if this names the --model it serves: serve_model passes the resolved directory.
        adapter_config = json.loads((partial / "adapter_config.json").read_text())
        base = adapter_config.get("base_model_name_or_path")
        if base and Path(base).is_dir():
            adapter_config["base_model_name_or_path"] = str(Path(base).resolve())
            (partial / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
        (partial / "training_config.json").write_text(config.to_json())
        lineage = {
            "name": name,
            "base_model": model.peft_config["default"].base_model_name_or_path,
            "target_ids": list(target_ids),
            **(extra or {}),
        }
        (partial / "lineage.json").write_text(json.dumps(lineage, indent=2, sort_keys=True))
        checksum = adapter_checksum(partial)
        make_readable_by_all(partial)
        # The lock makes "is the name free" and "take it" one step for every writer of this
        # root; os.rename alone would replace an empty directory of the same name.
        with FileLock(dest_root / ".write.lock"):
            if destination.exists():
                raise FileExistsError(f"adapter {name!r} already exists in {dest_root}")
            os.rename(partial, destination)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return AdapterInfo(path=destination, checksum=checksum)


def make_readable_by_all(adapter_dir: Path) -> None:
    """mkdtemp makes the dir 0700 and safetensors writes 0600: on a shared adapter store the
    model servers (often another user than the worker that trained) could not read it."""
    for path in adapter_dir.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    adapter_dir.chmod(0o755)


def adapter_checksum(adapter_dir: Path) -> str:
    """sha256 over the dir's files in sorted order: each file's relative path, size and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in adapter_dir.rglob("*") if p.is_file()):
        header = f"{path.relative_to(adapter_dir).as_posix()}\0{path.stat().st_size}\0"
        digest.update(header.encode())
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
