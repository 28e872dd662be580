from training.eval_sets import (
    GENERAL_REGRESSION_PROMPTS,
    general_regression_items,
    held_out_feedback,
)


def test_a_kind_with_enough_items_loses_its_share_to_the_held_out_set():
    texts = {feedback_id: "Begin with 'Answer:'" for feedback_id in range(10)}
    held_out = held_out_feedback(texts, fraction=0.2, seed=0)
    assert len(held_out) == 2
    assert held_out <= set(texts)


def test_kinds_are_compared_without_case_or_spacing_and_small_kinds_are_all_trained():
    texts = {1: "Be brief.", 2: "be  BRIEF.", 3: " Be brief. ", 4: "be brief.", 5: "Cite it."}
    held_out = held_out_feedback(texts, fraction=0.25, seed=0)
    assert len(held_out) == 1
    assert 5 not in held_out
    assert held_out_feedback({1: "a", 2: "a", 3: "a"}, fraction=0.5, seed=0) == set()


def test_the_split_is_repeatable_for_a_seed_and_changes_with_it():
    texts = {feedback_id: "same" for feedback_id in range(40)}
    first = held_out_feedback(texts, fraction=0.25, seed=1)
    assert first == held_out_feedback(texts, fraction=0.25, seed=1)
    assert first != held_out_feedback(texts, fraction=0.25, seed=2)


def test_no_fraction_holds_nothing_out():
    assert held_out_feedback({i: "same" for i in range(8)}, fraction=0.0, seed=0) == set()


def test_general_regression_items_carry_a_check_naming_the_fact():
    items = general_regression_items()
    assert len(items) == len(GENERAL_REGRESSION_PROMPTS)
    paris = items[0]
    assert paris["context"] == [{"role": "user", "content": "What is the capital of France?"}]
    assert paris["checks"] == [{"kind": "regex", "value": r"(?i)\bparis\b"}]
