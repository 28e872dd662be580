"""The evaluation gate: does a trained adapter earn traffic? Pure: the report in, a decision out.

The report is what training/tasks.py stores as the run's metrics: per-status counts for the
trained feedback items (`feedback_items`), and when present `held_out` and `regression` sections
with a `summary` of the same counts (regression also carries `mean_drift`).
"""

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from training.config import ConfigError, validation_problems


# Bounded like TrainingConfig: a count or a drift past these is a slip, not a policy.
@dataclass(frozen=True, config=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False))
class GateThresholds:
    # Feedback items (trained or held out) that passed their checks before training and fail after.
    max_regressed: int = Field(0, ge=0, le=1000)
    # Of the trained feedback items that failed before training, the share that must pass after.
    min_fixed_fraction: float = Field(0.5, ge=0.0, le=1.0)
    # The same share for held-out items of the same kind; 0 reports generalisation without
    # requiring it (a few held-out items are a noisy signal).
    min_held_out_fixed_fraction: float = Field(0.0, ge=0.0, le=1.0)
    # Regression prompts (general facts, approved good traces) that the base answered right and
    # the adapter gets wrong; one is tolerated as greedy-decoding noise on a small set.
    max_regression_failures: int = Field(1, ge=0, le=1000)
    # Mean per-token KL(base || adapter) on approved good replies, in nats: how far the adapter
    # drifted on traffic the feedback did not ask to change.
    max_mean_drift: float = Field(1.0, ge=0.0, le=100.0)

    @classmethod
    def from_settings(cls, values: dict | None) -> "GateThresholds":
        """The project's `gate` section; a ConfigError names each bad threshold."""
        try:
            return cls(**(values or {}))
        except ValidationError as error:
            raise ConfigError(validation_problems(error)) from None


def gate_decision(report: dict, thresholds: GateThresholds) -> tuple[bool, str]:
    """(passes, reason): the reason names every failed condition, or summarises a pass."""
    trained = report.get("feedback_items") or {}
    held_out = (report.get("held_out") or {}).get("summary") or {}
    regression = report.get("regression") or {}
    failures = []

    regressed = trained.get("regressed", 0) + held_out.get("regressed", 0)
    if regressed > thresholds.max_regressed:
        failures.append(
            f"{regressed} feedback item(s) regressed (allowed: {thresholds.max_regressed})"
        )
    fixed, failing_before = _fixed_of_failing(trained)
    if failing_before and fixed / failing_before < thresholds.min_fixed_fraction:
        failures.append(
            f"fixed {fixed} of {failing_before} failing item(s) ({fixed / failing_before:.0%}), "
            f"the gate asks for {thresholds.min_fixed_fraction:.0%}"
        )
    held_fixed, held_failing = _fixed_of_failing(held_out)
    if held_failing and held_fixed / held_failing < thresholds.min_held_out_fixed_fraction:
        failures.append(
            f"fixed {held_fixed} of {held_failing} held-out item(s) "
            f"({held_fixed / held_failing:.0%}), the gate asks for "
            f"{thresholds.min_held_out_fixed_fraction:.0%}"
        )
    broken = (regression.get("summary") or {}).get("regressed", 0)
    if broken > thresholds.max_regression_failures:
        failures.append(
            f"{broken} regression prompt(s) answered right before and wrong after "
            f"(allowed: {thresholds.max_regression_failures})"
        )
    drift = regression.get("mean_drift")
    if drift is not None and drift > thresholds.max_mean_drift:
        failures.append(
            f"drift from the base on approved replies {drift:.3f} nats/token "
            f"(allowed: {thresholds.max_mean_drift})"
        )
    if failures:
        return False, "; ".join(failures)

    summary = f"fixed {fixed} of {failing_before}, {regressed} regressed"
    if held_out:
        summary += f"; held out: fixed {held_fixed} of {held_failing}"
    if regression:
        summary += f"; regression prompts: {broken} broken"
        if drift is not None:
            summary += f", drift {drift:.3f}"
    return True, summary


def _fixed_of_failing(summary: dict) -> tuple[int, int]:
    fixed = summary.get("fixed", 0)
    return fixed, fixed + summary.get("still failing", 0)
