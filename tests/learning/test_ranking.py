"""The rank of a feedback's proposals."""

from reviewapp.learning.ranking import ProposalScore, proposal_rank


def _score(**overrides) -> ProposalScore:
    values = {
        "checks_passed": 1,
        "checks_total": 1,
        "passed_when_proposed": True,
        "well_formedness": 1.0,
        "closeness": 0.5,
        "order": 0,
    }
    return ProposalScore(**{**values, **overrides})


def test_the_rank_puts_readability_then_checks_then_closeness_first():
    scores = {
        "garbled, passing": _score(well_formedness=0.2, closeness=0.9),
        "garbled, failing": _score(well_formedness=0.2, checks_passed=0, closeness=0.9),
        "fails a check": _score(checks_passed=0, closeness=0.9),
        "cut off": _score(passed_when_proposed=False, closeness=0.9),
        "passing, far": _score(closeness=0.3, order=1),
        "passing, close": _score(closeness=0.6, order=2),
    }
    ranked = sorted(scores, key=lambda name: proposal_rank(scores[name]))
    assert ranked == [
        "passing, close",
        "passing, far",
        "cut off",
        "fails a check",
        "garbled, passing",
        "garbled, failing",
    ]
