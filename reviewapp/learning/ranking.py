"""Which of a feedback's proposals a reviewer sees first: a rank that keeps garbled text down
(training/readability.py scores how much a proposal reads as an answer)."""

from dataclasses import dataclass
from difflib import SequenceMatcher

from training.readability import WELL_FORMED_MIN


@dataclass(frozen=True)
class ProposalScore:
    """What the rank reads off one proposal."""

    checks_passed: int  # of the feedback's checks, run on the proposal now
    checks_total: int
    # The verdict stored when it was proposed: False also for an answer cut at max_tokens.
    passed_when_proposed: bool
    well_formedness: float
    closeness: float  # to the original answer, 0 to 1
    order: int  # the order the proposals were stored in
    # Follows every lesson the team gave before this feedback (learning/lessons.py).
    keeps_earlier_lessons: bool = True

    @property
    def passes_every_check(self) -> bool:
        return self.passed_when_proposed and self.checks_passed == self.checks_total

    @property
    def looks_garbled(self) -> bool:
        return self.well_formedness < WELL_FORMED_MIN


def proposal_rank(score: ProposalScore) -> tuple:
    """Sort key, best first: readable before garbled, then proposals passing every check,
    then those keeping the team's earlier lessons (as the worker's teacher prefers them), then
    more checks passed, then the closest to the original answer (the smallest change that
    does what the feedback asked keeps the rest, facts included), then stored order.

    Readability comes before the checks because the teacher stops sampling once a proposal
    passes, so a group seldom holds two: on the bundled model's proposals for 9 demo feedback
    items, 6 groups had a single passing one, and a rank led by the checks put a garbled
    proposal first in 5 groups (in none led by readability). A garbled proposal is not a target
    as it is; a readable one failing a check can be edited into one, and its chips say which.
    Well-formedness counts only as a yes or no (`looks_garbled`): among readable proposals the
    teacher's order by closeness holds. The teacher's own likelihood is not stored on a
    proposal, so it takes no part.
    """
    return (
        score.looks_garbled,
        not score.passes_every_check,
        not score.keeps_earlier_lessons,
        -score.checks_passed,
        -score.closeness,
        score.order,
    )


def closeness(original: str, revision: str) -> float:
    """How much of the original answer the revision keeps, by characters (0 to 1)."""
    return SequenceMatcher(None, original, revision).ratio()
