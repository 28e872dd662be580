import time

import pytest

from training.checks import check_problem, evaluate_checks

# Python's re backtracks exponentially on these; a worker running one with re.search hung.
CATASTROPHIC = [
    (r"(a+)+$", "a" * 100_000 + "b"),
    (r"(\w+\s?)*$", "an ordinary answer of sixty-four characters, ending in a dash -"),
]


@pytest.mark.parametrize(("pattern", "text"), CATASTROPHIC)
def test_a_catastrophic_pattern_is_answered_in_linear_time(pattern, text):
    started = time.perf_counter()
    [result] = evaluate_checks([{"kind": "regex", "value": pattern}], text=text, called_tools=())
    assert time.perf_counter() - started < 0.5
    assert result.passed is (pattern != r"(a+)+$")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"(\w+) \1", "invalid escape sequence: \\1"),
        (r"Paris(?= is)", "invalid perl operator: (?="),
        (r"(?<!not )sorry", "invalid perl operator: (?<!"),
    ],
)
def test_patterns_re2_cannot_run_are_refused_naming_the_problem(pattern, words):
    problem = check_problem("regex", pattern)
    assert words in problem
    assert "no backreferences or lookarounds" in problem


def test_an_overlong_pattern_is_refused():
    assert "at most 1000 characters" in check_problem("not_regex", "a" * 1001)


def test_a_pattern_re2_runs_is_accepted():
    assert check_problem("regex", r"(?i)^answer:\s+\d+") is None


def test_checks_pass_and_fail_on_text_and_tool_calls():
    checks = [
        {"kind": "regex", "value": r"(?i)^answer:"},
        {"kind": "not_regex", "value": "sorry"},
        {"kind": "max_words", "value": 2},
        {"kind": "calls_tool", "value": "search"},
    ]
    results = evaluate_checks(checks, text="Answer: sorry, no.", called_tools={"search"})
    assert [result.passed for result in results] == [True, False, False, True]
