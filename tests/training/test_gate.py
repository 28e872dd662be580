import pytest

from training.gate import GateThresholds, adherence, gate_decision


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
    report = _report({"fixed": 4}, regression={"summary": {"regressed": 3, "still passing": 19}})
    passes, reason = gate_decision(report, GateThresholds())
    assert not passes
    assert "3 regression prompt(s) answered right by the serving model and wrong after" in reason
    assert gate_decision(report, GateThresholds(max_regression_failures=3))[0]


def test_facts_lost_by_earlier_versions_count_against_the_candidate():
    # Two facts lost by the version that serves (they fail before and after: "still failing"
    # against it) and one more by the candidate: within the 2 allowed against what serves,
    # three against the base.
    lost = ["What is the capital of Peru?", "Who wrote Hamlet?", "What is 7 times 8?"]
    regression = {
        "summary": {"regressed": 1, "still failing": 2, "still passing": 19},
        "facts": {"asked": 22, "right_by_base": 22, "lost_from_base": lost},
    }
    passes, reason = gate_decision(_report({"fixed": 4}, regression=regression), GateThresholds())
    assert not passes
    assert (
        '3 general fact(s) the base answers right are wrong after (allowed: 2): "What is the '
        'capital of Peru?", "Who wrote Hamlet?", "What is 7 times 8?"'
    ) in reason
    assert "regression prompt(s)" not in reason
    passes, reason = gate_decision(
        _report({"fixed": 4}, regression=regression), GateThresholds(max_facts_lost_from_base=3)
    )
    assert passes
    assert "3 fact(s) lost since the base" in reason


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


def _lesson(text: str, trained: dict, held_out: dict | None = None, *, learned: bool = False):
    return {
        "lesson": text,
        "learned_by_serving": learned,
        "trained": trained,
        "held_out": held_out or {},
    }


def _lessons_report(*lessons: dict, regression: dict | None = None) -> dict:
    """A report whose pooled counts are the sums of its lessons', as evaluation builds it."""

    def pooled(section: str) -> dict:
        total: dict = {}
        for lesson in lessons:
            for name, count in lesson[section].items():
                total[name] = total.get(name, 0) + count
        return total

    report = {
        "feedback_items": pooled("trained"),
        "held_out": {"summary": pooled("held_out")},
        "per_lesson": list(lessons),
    }
    if regression is not None:
        report["regression"] = regression
    return report


def test_fixed_fractions_are_asked_of_each_lesson_not_pooled():
    """Pooled, 9 of 12 fixed (75%) would pass; the second lesson fixed 1 of 4 on its own."""
    report = _lessons_report(
        _lesson("answer in french", {"fixed": 8}),
        _lesson("end with a question", {"fixed": 1, "still failing": 3}),
    )

    passes, reason = gate_decision(report, GateThresholds())

    assert not passes
    assert reason == (
        'lesson "end with a question": fixed 1 of 4 failing item(s) (25%), the gate asks for 50%'
    )


def test_lessons_that_each_fix_enough_pass_and_the_summary_counts_them():
    report = _lessons_report(
        _lesson("answer in french", {"fixed": 3, "still failing": 1}),
        _lesson("end with a question", {"fixed": 2, "still failing": 2}),
    )

    passes, reason = gate_decision(report, GateThresholds())

    assert passes
    assert reason == "fixed 5 of 8, 0 regressed; 2 lessons each kept"


def test_an_earlier_lesson_the_candidate_loses_is_regressed_and_refused():
    """The serving adapter learned "answer in french"; the candidate forgot two of its items."""
    report = _lessons_report(
        _lesson("answer in french", {"still passing": 4, "regressed": 2}, learned=True),
        _lesson("end with a question", {"fixed": 4}),
    )

    passes, reason = gate_decision(report, GateThresholds())

    assert not passes
    assert reason.startswith(
        "2 feedback item(s) regressed against the serving model (allowed: 0): "
        '2 of lesson "answer in french"'
    )
    assert gate_decision(report, GateThresholds(max_regressed=2))[0]


def test_a_lesson_the_serving_adapter_learned_needs_no_fixed_fraction():
    """An item the serving adapter never got right need not be fixed again to keep a lesson."""
    report = _lessons_report(
        _lesson("answer in french", {"still passing": 5, "still failing": 1}, learned=True),
        _lesson("end with a question", {"fixed": 4}),
    )

    assert gate_decision(report, GateThresholds())[0]
    report["per_lesson"][0]["learned_by_serving"] = False
    passes, reason = gate_decision(report, GateThresholds())
    assert not passes
    assert 'lesson "answer in french": fixed 0 of 1' in reason


def test_held_out_adherence_below_the_serving_adapters_beyond_the_tolerance_is_refused():
    """Held out under serving 3 of 4 pass (0.75); under the candidate 2 of 4 (0.50): a 0.25
    drop. Two items regressed and one was fixed, so max_regressed=2 lets the counts pass."""
    lesson = _lesson(
        "answer in french",
        {"fixed": 2},
        {"still passing": 1, "regressed": 2, "fixed": 1},
        learned=True,
    )
    report = _lessons_report(lesson)
    thresholds = GateThresholds(max_regressed=2)

    passes, reason = gate_decision(report, thresholds)

    assert not passes
    assert reason == (
        'lesson "answer in french": held-out adherence 0.50 against 0.75 serving '
        "(a drop of at most 0.10 allowed)"
    )
    assert gate_decision(report, GateThresholds(max_regressed=2, max_held_out_adherence_drop=0.25))[
        0
    ]


def test_a_held_out_drop_within_the_tolerance_passes():
    """8 held-out items, one net loss: 0.125 of a drop against a 0.2 tolerance."""
    lesson = _lesson(
        "answer in french", {"fixed": 2}, {"still passing": 7, "regressed": 1}, learned=True
    )
    thresholds = GateThresholds(max_regressed=1, max_held_out_adherence_drop=0.2)

    assert gate_decision(_lessons_report(lesson), thresholds)[0]
    assert not gate_decision(_lessons_report(lesson), GateThresholds(max_regressed=1))[0]


def test_the_held_out_tolerance_is_bounded_and_comes_from_settings():
    assert GateThresholds.from_settings({"max_held_out_adherence_drop": 0.3}) == GateThresholds(
        max_held_out_adherence_drop=0.3
    )
    with pytest.raises(ValueError, match="max_held_out_adherence_drop"):
        GateThresholds.from_settings({"max_held_out_adherence_drop": 1.5})


def test_a_fact_the_serving_model_answers_and_the_candidate_breaks_is_refused():
    report = _lessons_report(
        _lesson("answer in french", {"fixed": 4}),
        regression={"summary": {"regressed": 3, "still passing": 19}},
    )

    passes, reason = gate_decision(report, GateThresholds())

    assert not passes
    assert "3 regression prompt(s) answered right by the serving model and wrong after" in reason


def test_adherence_is_the_share_passing_on_each_side():
    assert adherence({"fixed": 1, "still failing": 1, "regressed": 1, "still passing": 1}) == (
        0.5,
        0.5,
    )
    assert adherence({"fixed": 3, "still failing": 1}) == (0.0, 0.75)
    assert adherence({}) is None


def test_replies_garbled_where_the_serving_models_read_are_refused():
    garbled = [
        {"prompt": "What is the capital of France?", "before": "Paris.",
         "after": "L'Étoile, la femme, la femme, la femme, la femme, la femme"},
    ]  # fmt: skip
    report = {**_report({"fixed": 4}), "newly_garbled": garbled}

    passes, reason = gate_decision(report, GateThresholds())

    assert not passes
    assert "1 repl(ies) look garbled where the serving model's read as answers" in reason
    assert '"What is the capital of France?": "L\'Étoile, la femme' in reason
    assert gate_decision(report, GateThresholds(max_newly_garbled=1))[0]
    three = {**report, "newly_garbled": garbled * 3}
    assert gate_decision(three, GateThresholds())[1].endswith(', la femme" and 1 more')
    assert gate_decision(_report({"fixed": 4}), GateThresholds())[0]
