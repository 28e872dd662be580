"""The evaluation gate: does a trained adapter earn traffic? Pure: counts in, decision out."""

from dataclasses import dataclass


@dataclass(frozen=True)
class GateThresholds:
    # Feedback items that passed their checks before training and fail after.
    max_regressed: int = 0
    # Of the items that failed before training, the share that must pass after.
    min_fixed_fraction: float = 0.5

    @classmethod
    def from_settings(cls, values: dict | None) -> "GateThresholds":
        values = values or {}
        thresholds = cls(
            max_regressed=int(values.get("max_regressed", cls.max_regressed)),
            min_fixed_fraction=float(values.get("min_fixed_fraction", cls.min_fixed_fraction)),
        )
        if thresholds.max_regressed < 0 or not 0 <= thresholds.min_fixed_fraction <= 1:
            raise ValueError("gate: max_regressed >= 0 and 0 <= min_fixed_fraction <= 1")
        return thresholds


def gate_decision(summary: dict[str, int], thresholds: GateThresholds) -> tuple[bool, str]:
    """(passes, reason) from evaluation.summarize()'s per-status counts."""
    regressed = summary.get("regressed", 0)
    fixed = summary.get("fixed", 0)
    failing_before = fixed + summary.get("still failing", 0)
    if regressed > thresholds.max_regressed:
        return False, f"{regressed} item(s) regressed (allowed: {thresholds.max_regressed})"
    if failing_before:
        fraction = fixed / failing_before
        if fraction < thresholds.min_fixed_fraction:
            return False, (
                f"fixed {fixed} of {failing_before} failing item(s) ({fraction:.0%}); "
                f"the gate asks for {thresholds.min_fixed_fraction:.0%}"
            )
    return True, f"fixed {fixed} of {failing_before}, {regressed} regressed"
