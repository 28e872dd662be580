"""Training memory on agent episodes: one pass per micro-batch against passes of bounded tokens.

Run from the repository root, in the project's virtualenv (no database, no model server):

    python bench/train_memory.py

An agent's turns are long: the harness's system prompt, the tool definitions and the earlier
turns come before every reply. The trainer trains the bundled SmolLM2-135M-Instruct on 16 such
turns (the demo harness's auto-mode prompt and tools, a question, the calculator call) with 16
successful episodes as the forgetting guard's replay (call, result, answer: ~580 tokens each),
default settings but 4 updates, once per `max_tokens_per_pass` setting, each in a fresh process
so that its peak resident memory is its own. One pass per micro-batch (a budget no micro-batch
reaches) is the baseline; the script prints each setting's peak memory and time as a ratio to
it, and its loss curve, which must be the same (the passes add up to the same update).
"""

import argparse
import json
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # everything is on disk already

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/train_memory.py` puts bench/ first

from reviewapp.harness.agent import AUTO_SYSTEM_PROMPT  # noqa: E402
from reviewapp.harness.tools import TOOL_DEFINITIONS  # noqa: E402
from training.base_models import resolve_base_model  # noqa: E402
from training.config import TrainingConfig  # noqa: E402
from training.trainer import Example, add_lora, load_base_model, train  # noqa: E402

BASE_MODEL = "SmolLM2-135M-Instruct"
MODEL_CACHE_DIR = REPO_ROOT / "var" / "models"
ONE_PASS = 1_000_000  # more tokens than any micro-batch here holds


def _episode(number: int, *, answered: bool) -> Example:
    """The calculator turn of an episode, or (answered) the answer after its result."""
    left, right = number + 12, number + 3
    call_id = f"call-{number}"
    arguments = json.dumps({"expression": f"{left} * {right}"})
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "calculator", "arguments": arguments}}
        ],
    }  # fmt: skip
    context = [
        {"role": "system", "content": AUTO_SYSTEM_PROMPT},
        {"role": "user", "content": f"What is {left} times {right}? It goes on an invoice."},
    ]
    if not answered:
        return Example(context, call, TOOL_DEFINITIONS)
    context += [call, {"role": "tool", "tool_call_id": call_id, "content": str(left * right)}]
    answer = {"role": "assistant", "content": f"{left} times {right} is {left * right}."}
    return Example(context, answer, TOOL_DEFINITIONS)


def _one_run(budget: int, steps: int, results) -> None:
    """Train once (in a child process) and report peak memory, time and the loss curve."""
    import torch

    torch.manual_seed(0)
    config = TrainingConfig(
        min_steps=steps, epochs=1, save_every_steps=0, max_tokens_per_pass=budget
    )
    model, tokenizer = load_base_model(resolve_base_model(BASE_MODEL, MODEL_CACHE_DIR), config)
    model = add_lora(model, config)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    result = train(
        model,
        tokenizer,
        config,
        examples=[_episode(number, answered=False) for number in range(16)],
        replay=[_episode(100 + number, answered=True) for number in range(16)],
    )
    results.put(
        {
            "budget": budget,
            "seconds": time.monotonic() - started,
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,  # KiB on Linux
            "loaded_gb": before / 1e6,
            "loss": result.loss_curve,
            "steps": result.steps,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 1024],
                        help="max_tokens_per_pass settings measured beside one pass")  # fmt: skip
    parser.add_argument("--steps", type=int, default=4, help="optimizer updates per run")
    args = parser.parse_args()

    context = multiprocessing.get_context("spawn")  # a fresh process: its own peak memory
    rows = []
    for budget in [ONE_PASS, *args.budgets]:
        results = context.Queue()
        child = context.Process(target=_one_run, args=(budget, args.steps, results))
        child.start()
        rows.append(results.get())
        child.join()
        print(f"done: {rows[-1]['budget']} tokens per pass", flush=True)

    baseline = rows[0]
    print(f"\nload average after the runs: {os.getloadavg()[0]:.1f}")
    print("| tokens per pass | peak memory GB | ratio | seconds | ratio | loss curve |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        label = "one pass (baseline)" if row["budget"] == ONE_PASS else str(row["budget"])
        curve = ", ".join(f"{loss:.5f}" for loss in row["loss"])
        print(
            f"| {label} | {row['peak_gb']:.2f} | {row['peak_gb'] / baseline['peak_gb']:.2f} "
            f"| {row['seconds']:.1f} | {row['seconds'] / baseline['seconds']:.2f} | {curve} |"
        )
    print(f"(the model loaded: {baseline['loaded_gb']:.2f} GB before training)")


if __name__ == "__main__":
    main()
