import pytest

from training.gate import GateThresholds, gate_decision


def _report(trained: dict, *, held_out: dict | None = None, regression: dict | None = None):
    report = {"feedback_items": trained}
    if held_out is not None:
        report["held_out"] = {"summary": held_out}
    if regression is not None:
        report["regression"] = regression
    return report


def test_an_adapter_that_fixes_enough_and_breaks_nothing_passes():
    passes, reason = gate_decision(
        _report({"fixed": 3, "still failing": 1, "regressed": 0, "still passing": 2}),
        GateThresholds(),
    )
    assert passes
    assert reason == "fixed 3 of 4, 0 regressed"


def test_a_regression_fails_the_gate():
    passes, reason = gate_decision(_report({"fixed": 4, "regressed": 1}), GateThresholds())
    assert not passes
    assert "1 feedback item(s) regressed" in reason


def test_fixing_too_little_fails_the_gate():
    passes, reason = gate_decision(_report({"fixed": 1, "still failing": 3}), GateThresholds())
    assert not passes
    assert "fixed 1 of 4 failing item(s) (25%)" in reason


def test_nothing_failing_before_passes():
    assert gate_decision(_report({"still passing": 5}), GateThresholds())[0]


def test_a_held_out_item_that_regressed_counts_against_the_gate():
    passes, reason = gate_decision(
        _report({"fixed": 4}, held_out={"regressed": 1, "fixed": 1}), GateThresholds()
    )
    assert not passes
    assert "1 feedback item(s) regressed" in reason


def test_held_out_generalisation_is_required_only_when_the_project_asks():
    report = _report({"fixed": 4}, held_out={"fixed": 0, "still failing": 2})
    passes, reason = gate_decision(report, GateThresholds())
    assert passes
    assert "held out: fixed 0 of 2" in reason
    passes, reason = gate_decision(report, GateThresholds(min_held_out_fixed_fraction=0.5))
    assert not passes
    assert "fixed 0 of 2 held-out item(s) (0%), the gate asks for 50%" in reason


def test_broken_regression_prompts_fail_the_gate():
    report = _report({"fixed": 4}, regression={"summary": {"regressed": 2, "still passing": 6}})
    passes, reason = gate_decision(report, GateThresholds())
    assert not passes
    assert "2 regression prompt(s) answered right before and wrong after" in reason
    assert gate_decision(report, GateThresholds(max_regression_failures=2))[0]


def test_drift_from_the_base_beyond_the_limit_fails_the_gate():
    report = _report({"fixed": 4}, regression={"summary": {}, "mean_drift": 1.7})
    passes, reason = gate_decision(report, GateThresholds(max_mean_drift=1.5))
    assert not passes
    assert "drift from the base on approved replies 1.700" in reason
    passes, reason = gate_decision(report, GateThresholds(max_mean_drift=2.0))
    assert passes
    assert "drift 1.700" in reason


def test_every_failed_condition_is_named():
    report = _report(
        {"fixed": 0, "still failing": 2, "regressed": 1},
        regression={"summary": {"regressed": 3}, "mean_drift": 9.0},
    )
    passes, reason = gate_decision(report, GateThresholds())
    assert not passes
    assert len(reason.split("; ")) == 4


def test_thresholds_come_from_project_settings_and_are_validated():
    thresholds = GateThresholds.from_settings(
        {"max_regressed": 2, "min_fixed_fraction": 0.25, "max_mean_drift": 0.5}
    )
    assert thresholds == GateThresholds(
        max_regressed=2, min_fixed_fraction=0.25, max_mean_drift=0.5
    )
    with pytest.raises(ValueError, match="min_fixed_fraction"):
        GateThresholds.from_settings({"min_fixed_fraction": 2})
    with pytest.raises(ValueError, match="max_regresed: Unexpected keyword argument"):
        GateThresholds.from_settings({"max_regresed": 1})
    with pytest.raises(ValueError, match="max_mean_drift: Input should be a valid number"):
        GateThresholds.from_settings({"max_mean_drift": "a lot"})
