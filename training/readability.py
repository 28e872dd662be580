"""Does a reply read as an answer? A score from the text alone, with no model and no dictionary.

The bundled model's failures, read on the demo's proposals and on trained adapters' answers, are
seldom broken words: they are chat-template markup leaking into the answer (`<tool_response>`
around the reply), the hint repeated back as the answer, phrases that go round in circles ("la
femme, la femme, la femme...") and counts in place of answers ("Answer: 1. 1. 2. 3. ... 41.").
Each is cheap to see in the text. The review dashboard ranks proposals by it
(reviewapp/learning/ranking.py) and the gate refuses a candidate whose replies it newly finds
garbled (training/gate.py).
"""

import re
from difflib import SequenceMatcher

from training.chat import message_text

# Below this well-formedness a reply looks garbled: a proposal is ranked after the readable ones
# and left to a person by bulk approval, a candidate's reply counts against it at the gate.
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


def looks_garbled(text: str) -> bool:
    """Whether `text` scores below WELL_FORMED_MIN."""
    return well_formedness(text) < WELL_FORMED_MIN


def reply_looks_garbled(reply: dict, *, feedback_text: str = "") -> bool:
    """Whether an assistant message scores below WELL_FORMED_MIN (reply_well_formedness)."""
    return reply_well_formedness(reply, feedback_text=feedback_text) < WELL_FORMED_MIN
