"""The gate chooses among candidate adapters of one run: the final adapter, then earlier
checkpoints. An earlier checkpoint has learned less and forgotten less, so when the final one
broke facts an earlier one often passes. Library code: the worker and bench/learning.py both
call `choose_candidate`, so the benchmark measures what the product deploys."""

from collections.abc import Callable

from peft import PeftModel

from training.config import TrainingConfig
from training.gate import GateThresholds, gate_decision
from training.trainer import (
    TrainingResult,
    adapter_weights,
    checkpoint_step,
    load_adapter_weights,
)


def choose_candidate(
    model: PeftModel,
    config: TrainingConfig,
    result: TrainingResult,
    *,
    evaluate: Callable[[], dict],
    thresholds: GateThresholds,
) -> tuple[dict, list[dict]]:
    """Evaluate the final adapter, then earlier checkpoints (newest first, at least
    `save_every_steps` before the end), until one passes the gate or `gate_candidates` were
    tried. The model is left holding the chosen one: the first that passed, else the final one
    (kept for inspection). Returns the chosen one's report and one row per candidate tried."""
    earlier = sorted(
        (
            checkpoint
            for checkpoint in result.checkpoints
            if checkpoint_step(checkpoint) <= result.steps - config.save_every_steps
        ),
        key=checkpoint_step,
        reverse=True,
    )
    final = adapter_weights(model)
    tried: list[tuple[int, dict, bool, str]] = []
    for step, weights in [(result.steps, None), *((checkpoint_step(c), c) for c in earlier)]:
        if len(tried) == config.gate_candidates:
            break
        if weights is not None:
            load_adapter_weights(model, weights)
        report = evaluate()
        passes, reason = gate_decision(report, thresholds)
        tried.append((step, report, passes, reason))
        if passes:
            break
    chosen = next((row for row in tried if row[2]), tried[0])
    if chosen[0] != tried[-1][0]:  # none passed: back to the final adapter
        load_adapter_weights(model, final)
    candidates = [
        {
            "step": step,
            "chosen": step == chosen[0],
            "passed": passes,
            "reason": reason,
            "feedback_items": report["feedback_items"],
            "held_out": (report.get("held_out") or {}).get("summary"),
            "regression": report["regression"]["summary"],
        }
        for step, report, passes, reason in tried
    ]
    return chosen[1], candidates
