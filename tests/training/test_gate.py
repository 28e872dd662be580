import pytest

from training.gate import GateThresholds, gate_decision


def test_an_adapter_that_fixes_enough_and_breaks_nothing_passes():
    passes, reason = gate_decision(
        {"fixed": 3, "still failing": 1, "regressed": 0, "still passing": 2}, GateThresholds()
    )
    assert passes
    assert reason == "fixed 3 of 4, 0 regressed"


def test_a_regression_fails_the_gate():
    passes, reason = gate_decision({"fixed": 4, "regressed": 1}, GateThresholds())
    assert not passes
    assert "1 item(s) regressed" in reason


def test_fixing_too_little_fails_the_gate():
    passes, reason = gate_decision({"fixed": 1, "still failing": 3}, GateThresholds())
    assert not passes
    assert "fixed 1 of 4 failing item(s) (25%)" in reason


def test_nothing_failing_before_passes():
    assert gate_decision({"still passing": 5}, GateThresholds())[0]


def test_thresholds_come_from_project_settings_and_are_validated():
    thresholds = GateThresholds.from_settings({"max_regressed": 2, "min_fixed_fraction": 0.25})
    assert thresholds == GateThresholds(max_regressed=2, min_fixed_fraction=0.25)
    with pytest.raises(ValueError, match="min_fixed_fraction"):
        GateThresholds.from_settings({"min_fixed_fraction": 2})
