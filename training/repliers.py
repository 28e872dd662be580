"""Greedy replies for the evaluation: in the worker's process, or on a running model server.

A replier answers token-id prompts, each within its own token budget, from the base (adapter
off) or from the model's current adapter. On a vLLM server the base is the served model and the
adapter is saved to a scratch directory the server can read, loaded under a name of its own
that no route names (so no traffic reaches it), asked every prompt at once, then unloaded and
deleted. Plain httpx, no Django: reviewapp/learning/ lists the servers a run may ask
(ModelServers), `choose_replier` asks the first that serves the run's base model.
"""

import contextlib
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
from peft import PeftModel

from training.adapters import make_readable_by_all
from training.deploy import DeployError, load_adapter, unload_adapter
from training.sampling import adapter_disabled, generate_replies


class Replier(Protocol):
    def greedy_replies(
        self, model: PeftModel, prompts: list[list[int]], budgets: list[int], *, adapter_on: bool
    ) -> list[list[int]]:
        """One greedy reply per prompt, at most its budget long, ending with the end-of-turn
        token when the model wrote one. `adapter_on`: under the model's active adapter (the
        candidate, or the serving adapter loaded beside it); off: the base."""
        ...


# Prompts generated together in this process. On 2 CPU cores, 34 gate prompts of 64 tokens under
# a LoRA adapter took 40 s in batches of 8 and 16 s in one batch (vLLM CPU: 54 s); the KV cache
# of 32 prompts of ~700 tokens on the bundled model is under 1 GB.
GENERATION_BATCH_SIZE = 32


class InProcessReplier:
    """HF generate in this process, prompts of similar budgets batched together."""

    def __init__(self, eos_token_id: int, batch_size: int = GENERATION_BATCH_SIZE) -> None:
        self.eos_token_id = eos_token_id
        self.batch_size = batch_size

    def greedy_replies(
        self, model: PeftModel, prompts: list[list[int]], budgets: list[int], *, adapter_on: bool
    ) -> list[list[int]]:
        # A batch generates as long as its longest budget; each reply is then cut to its own,
        # which greedy decoding makes the same as generating it alone.
        order = sorted(range(len(prompts)), key=lambda index: budgets[index])
        replies: list[list[int]] = [[] for _ in prompts]
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            with contextlib.nullcontext() if adapter_on else adapter_disabled(model):
                batch = generate_replies(
                    model,
                    [prompts[i] for i in chunk],
                    eos_token_id=self.eos_token_id,
                    max_new_tokens=max(budgets[i] for i in chunk),
                    temperature=None,
                )
            for index, reply in zip(chunk, batch, strict=True):
                replies[index] = reply[: budgets[index]]
        return replies


class ServerError(RuntimeError):
    """The model server did not answer the evaluation."""


class ServerReplier:
    """Greedy replies from a vLLM server; after its first failure, every later call (and the
    failed one) is answered by `fallback`. `record` says which answered how many replies."""

    def __init__(
        self,
        client: httpx.Client,
        base_url: str,
        *,
        base_model: str,
        scratch_dir: Path,
        eos_token_id: int,
        fallback: Replier,
        name_prefix: str = "eval",
        concurrency: int = 32,
    ) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.base_model = base_model
        self.scratch_dir = scratch_dir
        self.eos_token_id = eos_token_id
        self.fallback = fallback
        self.name_prefix = name_prefix
        self.concurrency = concurrency
        self.record = {
            "server": self.base_url,
            "server_replies": 0,
            "in_process_replies": 0,
            "error": "",
            # Seconds spent on replies, server and fallback together: the rest of an
            # evaluation is measured in the worker (divergence, checks).
            "reply_seconds": 0.0,
        }

    def greedy_replies(
        self, model: PeftModel, prompts: list[list[int]], budgets: list[int], *, adapter_on: bool
    ) -> list[list[int]]:
        started = time.monotonic()
        try:
            return self._replies(model, prompts, budgets, adapter_on=adapter_on)
        finally:
            self.record["reply_seconds"] += time.monotonic() - started

    def _replies(
        self, model: PeftModel, prompts: list[list[int]], budgets: list[int], *, adapter_on: bool
    ) -> list[list[int]]:
        if not self.record["error"]:
            try:
                if adapter_on:
                    replies = self._with_temporary_adapter(model, prompts, budgets)
                else:
                    replies = self._complete(self.base_model, prompts, budgets)
            except (ServerError, DeployError, httpx.HTTPError, OSError) as error:
                self.record["error"] = f"{type(error).__name__}: {error}"[:500]
            else:
                self.record["server_replies"] += len(prompts)
                return replies
        replies = self.fallback.greedy_replies(model, prompts, budgets, adapter_on=adapter_on)
        self.record["in_process_replies"] += len(prompts)
        return replies

    def _with_temporary_adapter(
        self, model: PeftModel, prompts: list[list[int]], budgets: list[int]
    ) -> list[list[int]]:
        name = f"{self.name_prefix}-{uuid.uuid4().hex[:12]}"
        directory = self.scratch_dir / name
        try:
            # The active adapter only: the candidate, or the serving one loaded beside it.
            active = model.active_adapter
            model.save_pretrained(directory, selected_adapters=[active])
            saved = directory if active == "default" else directory / active
            make_readable_by_all(directory)
            load_adapter(self.client, self.base_url, name=name, path=str(saved))
            try:
                return self._complete(name, prompts, budgets)
            finally:
                unload_adapter(self.client, self.base_url, name=name)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _complete(
        self, model_name: str, prompts: list[list[int]], budgets: list[int]
    ) -> list[list[int]]:
        """One request per prompt, all in flight together: the server batches them."""

        def complete(prompt: list[int], budget: int) -> list[int]:
            response = self.client.post(
                f"{self.base_url}/completions",
                json={
                    "model": model_name,
                    "prompt": prompt,
                    "max_tokens": budget,
                    "temperature": 0,
                    "stop_token_ids": [self.eos_token_id],
                    "return_token_ids": True,
                },
            )
            if response.status_code >= 400:
                raise ServerError(f"HTTP {response.status_code}: {response.text[:300]}")
            try:
                reply = list(response.json()["choices"][0]["token_ids"])
            except (ValueError, KeyError, IndexError, TypeError) as error:
                raise ServerError(f"no reply token ids in the answer: {error!r}") from None
            end = reply.index(self.eos_token_id) + 1 if self.eos_token_id in reply else len(reply)
            return reply[:end]

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(complete, prompts, budgets))


@dataclass(frozen=True)
class ModelServers:
    """The model servers an evaluation may ask (vLLM, OpenAI-compatible base URLs)."""

    urls: tuple[str, ...]
    served_model: str  # the name they serve the base model under
    scratch_dir: Path  # where candidates are saved for a server to load: it must read it too
    name_prefix: str  # candidates load as `<prefix>-<random>`, names no route knows


def choose_replier(
    client: httpx.Client,
    servers: ModelServers | None,
    *,
    model_dir: Path,
    base_model: str,
    eos_token_id: int,
) -> tuple[Replier, dict]:
    """The first of `servers` that answers and serves `base_model` (from `model_dir`), else
    this process. Returns the replier and the record of what answered (filled in as it
    answers)."""
    in_process = InProcessReplier(eos_token_id)
    for url in servers.urls if servers else ():
        try:
            served = client.get(f"{url}/models", timeout=5).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            continue
        # The served name alone could be another model: the weights' directory must match too.
        roots = {entry.get("root") for entry in served if entry.get("id") == servers.served_model}
        if not any(_same_model(root, model_dir, base_model) for root in roots):
            continue
        server = ServerReplier(
            client,
            url,
            base_model=servers.served_model,
            scratch_dir=servers.scratch_dir,
            eos_token_id=eos_token_id,
            fallback=in_process,
            name_prefix=servers.name_prefix,
        )
        return server, server.record
    return in_process, {"server": "", "error": "no model server serving the base model answered"}


def _same_model(root: str | None, model_dir: Path, base_model: str) -> bool:
    """vLLM's `root` is the --model it was started with: the base model's name or a directory
    (the same one, or a copy of it under the same name on the server's machine)."""
    if not root:
        return False
    return root == base_model or Path(root).name == Path(model_dir).resolve().name
