"""Which of a feedback's proposals a reviewer sees first: a rank that keeps garbled text down.

The bundled teacher's failures, read on the demo's proposals, are seldom broken words: they are
chat-template markup leaking into the answer (`<tool_response>` around the reply), the hint
repeated back as the answer, and phrases that go round in circles. Each is cheap to see in the
text alone, so the score needs no model and no dictionary file.
"""

import re
from dataclasses import dataclass
from difflib import SequenceMatcher

from messages.text import message_text

# Below this well-formedness a proposal is marked "looks garbled" and ranked after the readable
# ones; bulk approval leaves it to a person.
WELL_FORMED_MIN = 0.6
# A proposal at least this close to the feedback (characters, case folded) repeats the hint
# instead of following it.
ECHO_MIN = 0.8
# An answer of this many words or more in which fewer than half have letters is a count, not an
# answer: a deployed adapter answered new questions with "Answer: 1. 1. 2. 3. 4. ... 41.", and
# "checks pass" approval took edits of it (bench/README.md, run Q).
NUMBERS_MIN_WORDS = 8

_WORDS = re.compile(r"[^\W\d_]+|\d+(?:[.,]\d+)*")
_VOWELS = re.compile(r"[aeiouyà-ÿ]", re.IGNORECASE)
_SAME_CHAR_RUN = re.compile(r"(.)\1\1")
# Role and tool markup of the chat template (hermes style): never part of an answer's text.
_TEMPLATE_MARKUP = re.compile(r"</?(tool_response|tool_call|tools)>|<\|im_(start|end)\|>")


def _word_like(word: str) -> bool:
    """A number, or letters that could be a word: not too long, a vowel past three letters,
    no letter three times in a row."""
    if word[0].isdigit():
        return True
    if len(word) > 20 or _SAME_CHAR_RUN.search(word.lower()):
        return False
    return len(word) <= 3 or _VOWELS.search(word) is not None


def well_formedness(text: str, *, feedback_text: str = "") -> float:
    """How much `text` reads as an answer, from 0 (garbled) to 1.

    The share of word-like tokens, times the share of distinct word trigrams (1 when nothing
    repeats), times twice the share of words with letters when fewer than half of a long text's
    have them, halved when chat-template markup leaks into it, and near zero when it repeats the
    feedback. Text with no words (empty, or punctuation only) scores 0.
    """
    words = _WORDS.findall(text)
    if not words:
        return 0.0
    word_like = sum(_word_like(word) for word in words) / len(words)
    folded = [word.lower() for word in words]
    trigrams = list(zip(folded, folded[1:], folded[2:], strict=False))
    distinct = len(set(trigrams)) / len(trigrams) if trigrams else 1.0
    score = word_like * distinct
    if len(words) >= NUMBERS_MIN_WORDS:
        with_letters = sum(not word[0].isdigit() for word in words) / len(words)
        score *= min(1.0, 2 * with_letters)
    if _TEMPLATE_MARKUP.search(text):
        score /= 2
    if feedback_text and _echoes(text, feedback_text):
        score *= 0.1
    return score


def reply_well_formedness(reply: dict, *, feedback_text: str = "") -> float:
    """well_formedness of an assistant message's text; 1 for one that only calls tools (it has
    no prose to judge)."""
    text = message_text(reply)
    if reply.get("tool_calls") and not text.strip():
        return 1.0
    return well_formedness(text, feedback_text=feedback_text)


def _echoes(text: str, feedback_text: str) -> bool:
    folded, feedback = text.strip().casefold(), feedback_text.strip().casefold()
    return feedback in folded or SequenceMatcher(None, folded, feedback).ratio() >= ECHO_MIN


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
