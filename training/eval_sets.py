"""What the evaluation gate asks besides the trained feedback: held-out feedback of the same kind,
and regression prompts whose answers must survive training. Pure data and pure functions.
"""

import hashlib
from collections import defaultdict
from collections.abc import Mapping

# A fixed general set: short questions the bundled base model answers correctly (each check
# names the fact), so an adapter that breaks one has damaged knowledge the feedback never touched.
# Checks are loose on purpose: "Answer: Paris." and "It is Paris" both keep the fact. The second
# eleven were added when 11 proved too few to see a loss: on bench/learning.py's development set
# an adapter taught to answer in bullets kept all of the first eleven and lost 6 of 16 other
# facts ("- Sweden is a Scandinavian country..."), 5 of them capitals (bench/README.md,
# "Factual questions in the development set, and the gate's facts"). None is a question of
# bench/learning.py's held-out sets or of the guard. Two of the first eleven the base never
# answered right (Neptune the largest planet; the continents "129.99..."), so an adapter that
# happened to answer one made the next candidate "break" it: they were replaced by the water
# formula and Hamlet's author (tests/training/test_bundled_model.py keeps every fact answered).
GENERAL_REGRESSION_PROMPTS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", r"(?i)\bparis\b"),
    ("Who painted the Mona Lisa?", r"(?i)\bleonardo\b|\bda vinci\b"),
    ("What is the tallest mountain on Earth?", r"(?i)\beverest\b"),
    ("How many days are in a week?", r"(?i)\b(7|seven)\b"),
    ("What is the chemical formula for water?", r"H2O|H₂O"),
    ("What language is spoken in Brazil?", r"(?i)\bportuguese\b"),
    ("Who wrote Romeo and Juliet?", r"(?i)\bshakespeare\b"),
    ("What is the boiling point of water in Celsius?", r"\b100\b"),
    ("What is the chemical symbol for gold?", r"\bAu\b"),
    ("Who wrote Hamlet?", r"(?i)\bshakespeare\b"),
    ("What gas do plants take in from the air?", r"(?i)carbon dioxide|\bCO2\b|CO₂"),
    ("What is the capital of Russia?", r"(?i)\bmoscow\b"),
    ("What is the capital of Poland?", r"(?i)\bwarsaw\b"),
    ("What is the capital of Austria?", r"(?i)\bvienna\b"),
    ("What is the capital of South Korea?", r"(?i)\bseoul\b"),
    ("What is the capital of Kenya?", r"(?i)\bnairobi\b"),
    ("What is the capital of Peru?", r"(?i)\blima\b"),
    ("Who invented the telephone?", r"(?i)\bbell\b"),
    ("Who was the first person to walk on the Moon?", r"(?i)\barmstrong\b"),
    ("What language is spoken in Germany?", r"(?i)\bgerman\b"),
    ("What is the chemical symbol for iron?", r"\bFe\b"),
    ("What is the currency of the United States?", r"(?i)\bdollars?\b"),
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


# The forgetting guard's tool episodes, for a run that teaches an action (training/replay.py):
# a question, one call to a tool, its successful result, under a system prompt like an agent's;
# the base's own answer after the result is replayed, so a lesson about calling a tool leaves
# alone how the model answers once the tool has answered. Tools of their own (none is the demo
# agent's), and no failed result: what to say after a failure is a lesson teams give.
TOOL_REPLAY_SYSTEM_PROMPT = (
    "You are a helpful assistant. Call a tool when the question needs one, then answer in one "
    "short sentence using the tool result."
)
# (tool, what it does, its one parameter, the question, the argument, the result)
TOOL_REPLAY_EPISODES: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("get_weather", "Current weather in a city.", "city",
     "What's the weather like in Oslo right now?", "Oslo", "4 C, light rain"),
    ("define_word", "The dictionary definition of a word.", "word",
     "What does 'ephemeral' mean?", "ephemeral", "lasting for a very short time"),
    ("get_population", "The population of a country.", "country",
     "How many people live in Portugal?", "Portugal", "10.4 million"),
    ("translate_to_french", "Translate English text to French.", "text",
     "How do I say 'good morning' in French?", "good morning", "bonjour"),
    ("stock_price", "The latest price of a stock, in US dollars.", "symbol",
     "What is Apple's stock price?", "AAPL", "189.25"),
    ("get_distance_km", "Road distance in kilometres from Paris to a city.", "city",
     "How far is Lyon from Paris by road?", "Lyon", "465"),
    ("opening_hours", "Opening hours of a shop.", "shop",
     "When is the bakery open today?", "bakery", "7:00 to 19:00"),
    ("convert_to_celsius", "Convert a temperature in Fahrenheit to Celsius.", "fahrenheit",
     "What is 68 Fahrenheit in Celsius?", "68", "20"),
)  # fmt: skip

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
