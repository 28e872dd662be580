"""What the evaluation gate asks besides the trained feedback: held-out feedback of the same kind,
and regression prompts whose answers must survive training. Pure data and pure functions.
"""

import hashlib
from collections import defaultdict
from collections.abc import Mapping

# A fixed general set: short questions the bundled base model answers correctly (each check
# names the fact), so an adapter that breaks one has damaged knowledge the feedback never touched.
# Checks are loose on purpose: "Answer: Paris." and "It is Paris" both keep the fact.
GENERAL_REGRESSION_PROMPTS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", r"(?i)\bparis\b"),
    ("Who painted the Mona Lisa?", r"(?i)\bleonardo\b|\bda vinci\b"),
    ("What is the tallest mountain on Earth?", r"(?i)\beverest\b"),
    ("How many days are in a week?", r"(?i)\b(7|seven)\b"),
    ("What is the largest planet in the solar system?", r"(?i)\bjupiter\b"),
    ("What language is spoken in Brazil?", r"(?i)\bportuguese\b"),
    ("Who wrote Romeo and Juliet?", r"(?i)\bshakespeare\b"),
    ("What is the boiling point of water in Celsius?", r"\b100\b"),
    ("What is the chemical symbol for gold?", r"\bAu\b"),
    ("How many continents are there on Earth?", r"(?i)\b(7|seven)\b"),
    ("What gas do plants take in from the air?", r"(?i)carbon dioxide|\bCO2\b|CO₂"),
)

# The forgetting guard's prompts (training/replay.py: the base's own answers to them are the
# replay set). General and varied, and none is a regression prompt above: the guard must not
# be trained on the gate's test.
REPLAY_PROMPTS: tuple[str, ...] = (
    "What is photosynthesis?",
    "Give me three tips for staying focused while studying.",
    "How do I boil an egg?",
    "Explain what a noun is.",
    "What is the difference between weather and climate?",
    "Write a short greeting for a birthday card.",
    "Why is the sky blue?",
    "How many legs does a spider have?",
    "What does a thermometer measure?",
    "Suggest a name for a pet goldfish.",
    "What is the opposite of hot?",
    "How do you say hello in Spanish?",
    "What is 12 times 3?",
    "Describe a cat in one sentence.",
    "What are the three states of matter?",
    "What should I pack for a day at the beach?",
    "What is the main ingredient of guacamole?",
    "Explain what a computer program is.",
    "How can I save money on groceries?",
    "What is the freezing point of water in Fahrenheit?",
    "Which animal is known as the king of the jungle?",
    "What is a synonym for happy?",
    "How do plants get water?",
    "Write one sentence about the ocean.",
    "What is the square root of 81?",
    "Why do we need sleep?",
    "Name a primary color.",
    "How do I write a polite email to ask for a meeting?",
    "What does a bee make?",
    "What is the plural of mouse?",
    "What is a healthy breakfast?",
    "Explain what gravity does.",
    "What is the capital of Japan?",
    "How many minutes are in an hour?",
    "Give an example of a fruit that is yellow.",
    "What is recycling?",
    "What instrument has black and white keys?",
    "Summarise the story of Cinderella in one sentence.",
    "What do you call a baby dog?",
    "How can I make my handwriting neater?",
)


# Feedback kinds with fewer items than this are all trained on: holding out one of three would
# cost a third of the data to learn almost nothing about generalisation.
MIN_ITEMS_TO_HOLD_OUT = 4


def general_regression_items() -> list[dict]:
    return [
        {
            "source": "general",
            "prompt": question,
            "context": [{"role": "user", "content": question}],
            "checks": [{"kind": "regex", "value": pattern}],
        }
        for question, pattern in GENERAL_REGRESSION_PROMPTS
    ]


def feedback_kind(text: str) -> str:
    """Feedback items of the same kind say the same thing: compared without case or spacing."""
    return " ".join(text.lower().split())


def held_out_feedback(feedback_texts: Mapping[int, str], *, fraction: float, seed: int) -> set[int]:
    """Feedback ids to evaluate on but not train on: `fraction` of each kind with enough items.

    Deterministic for a seed (a hash orders each kind), so a repeated run holds out the same ones.
    """
    by_kind: dict[str, list[int]] = defaultdict(list)
    for feedback_id, text in feedback_texts.items():
        by_kind[feedback_kind(text)].append(feedback_id)
    held_out: set[int] = set()
    for ids in by_kind.values():
        count = int(len(ids) * fraction)
        if len(ids) < MIN_ITEMS_TO_HOLD_OUT or count == 0:
            continue
        ranked = sorted(ids, key=lambda feedback_id: _rank(seed, feedback_id))
        held_out.update(ranked[:count])
    return held_out


def _rank(seed: int, feedback_id: int) -> str:
    return hashlib.sha256(f"{seed}:{feedback_id}".encode()).hexdigest()
