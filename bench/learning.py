"""Does the loop teach, and does it teach what the prompted model does? Per feedback kind, what a
reviewed batch does to questions nobody reviewed, over several seeds.

Run from the repository root, in the project's virtualenv:

    python bench/learning.py                            # the test set, 3 seeds: README figures
    python bench/learning.py --set dev                  # the set the defaults were chosen on
    python bench/learning.py --kinds question --seeds 0 --mode distill
    python bench/learning.py --set dev --kinds also --preference-weight 0   # sft alone

Two sets, never mixed. The development set (6 kinds, 8 held-out questions) is the one every
default (guard weight, learning rate, steps, candidates, worked examples, teacher prompt, the
gate's tolerances) was chosen on; its figures say nothing about generality. A seventh kind,
"also", was added later to weigh the preference term on a lesson the base mostly follows, and
16 factual questions the base answers right (24 held out in all), so that a default chosen there
is judged on the facts it keeps too. The test set (6 other kinds, 24 held-out factual questions,
each with the fact its answer must keep) is never tuned on: the README's figures come from it.

For each kind, as a team would give it, and for each seed:
- 16 questions answered by the bundled SmolLM2-135M-Instruct (greedy, as served); each answer
  gets the same written feedback with a machine check; 4 of the 16 also get a corrected answer
  (written from the original answer, as a reviewer would);
- targets on the worker's path (training/targets.py with the worker's sample counts and budget):
  corrections as they are, the teacher (the base shown the feedback after the 4 corrections as
  worked examples) sampled until a revision passes the check or the budget is spent, the best
  passing one approved, as the "checks pass" approval policy (or a reviewer) would;
- one training job with default settings (TrainingConfig(), only `mode` and `seed` set) through
  the worker's own entry point, training/job.run_job: the forgetting guard's replay set, the gate
  choosing among candidates (the final adapter, then an earlier checkpoint when it fails), the
  chosen adapter written as the worker writes it;
- on the held-out questions: adherence to the feedback (its check) of the base, of three prompted
  baselines and of the adapter: the feedback as a system prompt (what a user tries first), the
  feedback in the user turn, and the teacher's own prompt (the hint with the 4 worked examples:
  what the adapter is meant to bake in, with no prompt tokens); answer correctness (the share of
  held-out factual answers that keep their fact) of the base and the adapter, since a
  check alone can be passed by a degenerate answer; and the gate's general facts.

Library code only (transformers, no Django, no vLLM): minutes are this process's wall clock on
this machine, teacher sampling included; with vLLM serving the teacher, targets come faster.
"""

import argparse
import dataclasses
import re
import statistics
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.base_models import resolve_base_model
from training.chat import render_prompt
from training.checks import evaluate_checks
from training.config import GuardReference, PreferenceLessons, TrainingConfig
from training.gate import GateThresholds
from training.job import Progress, TrainingJob, run_job
from training.sampling import generate_replies
from training.targets import (
    TEACHER_BUDGET,
    TEACHER_SAMPLES_PER_ROUND,
    LessonHint,
    TransformersTeacher,
    WorkedExample,
    hint_context,
    propose_targets,
)
from training.trainer import DistillItem, Example, load_base_model

# Greedy answers to the questions, as the harness would get them.
MAX_ANSWER_TOKENS = 96


@dataclass(frozen=True)
class Kind:
    name: str
    feedback: str
    check: dict
    correct: Callable[[str], str]  # a reviewer's corrected answer, from the original one
    # The same reviewer keeping the given complete sentences of the original (the original
    # passed too): every one (--corrections whole) or the opening ones (--corrections lead);
    # None where cutting the answer is the lesson itself.
    correct_kept: Callable[[list[str], str], str] | None = None

    def corrected(self, original: str, corrections: str) -> str:
        keep = KEPT_SENTENCES.get(corrections)
        if keep and self.correct_kept:
            return self.correct_kept(keep(original), original)
        return self.correct(original)


@dataclass(frozen=True)
class HeldOut:
    question: str
    fact: str | None = None  # a pattern the answer must match to be correct; None: not judged

    def kept_by(self, reply: str) -> bool:
        """Whether `reply` keeps the fact (judged questions only)."""
        return bool(self.fact and re.search(self.fact, reply))


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s", text.strip()) if s]


def _complete(text: str) -> list[str]:
    """The answer's complete sentences: what a reviewer keeps of an answer the harness's token
    limit cut off, dropping only the unfinished tail (the first sentence is kept whatever)."""
    sentences = _sentences(text)
    if len(sentences) > 1 and not re.search(r"[.!?][\"')]*$", sentences[-1]):
        sentences = sentences[:-1]
    return sentences


# What a reviewer keeps of an answer's opening (--corrections lead): the complete sentences up to
# this many words, less than half what the harness's 96 tokens hold, so the lesson fits after.
LEAD_WORDS = 40


def _lead(text: str) -> list[str]:
    """The answer's opening complete sentences within LEAD_WORDS words (the first whatever its
    length): the content the base often states after an opener ("The answer to this question
    is rooted in...") is kept, the length is not."""
    kept, words = [], 0
    for sentence in _complete(text):
        words += len(sentence.split())
        if kept and words > LEAD_WORDS:
            break
        kept.append(sentence)
    return kept


# The sentences each --corrections choice other than "first" keeps of the original.
KEPT_SENTENCES: dict[str, Callable[[str], list[str]]] = {"whole": _complete, "lead": _lead}


# The development set: the defaults were chosen on it.
DEV_TRAIN_QUESTIONS = (
    "What causes rain?",
    "How do I keep houseplants alive?",
    "Why do leaves change colour in autumn?",
    "What is a good way to learn a new language?",
    "How does a bicycle stay upright?",
    "What should I do if I cannot sleep?",
    "Why is exercise good for you?",
    "How do bees make honey?",
    "What is the best way to store bread?",
    "Why do cats purr?",
    "How can I be more productive in the morning?",
    "What makes a good cup of tea?",
    "Why do we have seasons?",
    "How do I clean a cast iron pan?",
    "What is the difference between a lake and a pond?",
    "How do I start running as a beginner?",
)
DEV_HELD_OUT_QUESTIONS = (
    "Why does bread go stale?",
    "How do birds know where to migrate?",
    "What is a good gift for a friend who likes cooking?",
    "Why is the ocean salty?",
    "How do I make my room less cluttered?",
    "What causes thunder?",
    "How can I remember names better?",
    "Why do onions make you cry?",
)
# Factual questions the base answers right, none of them in the test set, the gate's facts or
# the forgetting guard's prompts: without them the development set judged no answer's
# correctness, and a default could be chosen there that breaks facts.
DEV_HELD_OUT_FACTS = (
    HeldOut("What is the capital of Sweden?", r"(?i)\bstockholm\b"),
    HeldOut("What is the capital of the Netherlands?", r"(?i)\bamsterdam\b"),
    HeldOut("What is the capital of Ireland?", r"(?i)\bdublin\b"),
    HeldOut("What is the capital of India?", r"(?i)\bnew delhi\b"),
    HeldOut("What is the capital of China?", r"(?i)\bbeijing\b"),
    HeldOut("What is the capital of Egypt?", r"(?i)\bcairo\b"),
    HeldOut("What is the capital of Greece?", r"(?i)\bathens\b"),
    HeldOut("What is the capital of Australia?", r"(?i)\bcanberra\b"),
    HeldOut("What is the capital of Canada?", r"(?i)\bottawa\b"),
    HeldOut("Who wrote Pride and Prejudice?", r"(?i)\baust[ei]n\b"),
    HeldOut("What is the longest river in Africa?", r"(?i)\bnile\b"),
    HeldOut("Who developed the theory of relativity?", r"(?i)\beinstein\b"),
    HeldOut("Which planet is known as the Red Planet?", r"(?i)\bmars\b"),
    HeldOut("What language is spoken in France?", r"(?i)\bfrench\b"),
    HeldOut("Who discovered penicillin?", r"(?i)\bfleming\b"),
    HeldOut("What is the chemical symbol for oxygen?", r"\bO\b"),
)


DEV_KINDS = (
    Kind(
        "prefix",
        "Always begin your answer with 'Answer:'.",
        {"kind": "regex", "value": r"^Answer:"},
        lambda text: f"Answer: {text}",
    ),
    Kind(
        "words",
        "Too long. Answer in at most 25 words.",
        {"kind": "max_words", "value": 25},
        lambda text: " ".join(_first_sentence(text).split()[:25]),
    ),
    Kind(
        "ending",
        "End every answer with the sentence 'Hope this helps.'",
        {"kind": "regex", "value": r"Hope this helps\.?\s*$"},
        lambda text: f"{_first_sentence(text)} Hope this helps.",
        lambda kept, _: f"{' '.join(kept)} Hope this helps.",
    ),
    Kind(
        "lowercase",
        "Write your whole answer in lowercase letters, no capitals.",
        {"kind": "not_regex", "value": r"[A-Z]"},
        lambda text: text.lower(),
    ),
    Kind(
        "expert",
        "Always suggest asking an expert for more help.",
        {"kind": "regex", "value": r"(?i)\bexpert"},
        lambda text: f"{_first_sentence(text)} For more help, ask an expert.",
        lambda kept, _: f"{' '.join(kept)} For more help, ask an expert.",
    ),
    Kind(
        "bullets",
        "Format the answer as a bulleted list, each line starting with '- '.",
        {"kind": "regex", "value": r"^- "},
        lambda text: "\n".join(f"- {s}" for s in re.split(r"(?<=[.!?])\s", text.strip())[:3]),
        lambda kept, _: "\n".join(f"- {s}" for s in kept),
    ),
    # A lesson the base mostly follows already (7 of its 24 answers here use "also"): where sft
    # regresses a few items that passed, and the preference term is to be weighed.
    Kind(
        "also",
        "Do not use the word 'also'.",
        {"kind": "not_regex", "value": r"(?i)\balso\b"},
        lambda text: re.sub(r"(?i)\balso\s+", "", text),
    ),
)


# The test set: nothing was tuned on it. Other kinds of feedback (how an answer ends, its length,
# a word to avoid, emphasis, structure, a closing summary), other training questions, and
# held-out questions whose answers carry a fact, so correctness is judged beside adherence.
TEST_TRAIN_QUESTIONS = (
    "How do I make a paper airplane?",
    "Why do dogs wag their tails?",
    "What is a good way to start journaling?",
    "How do volcanoes erupt?",
    "Why do we yawn?",
    "How can I drink more water during the day?",
    "What makes a rainbow appear?",
    "How do I care for a succulent?",
    "Why does the moon change shape?",
    "What is a healthy way to handle stress?",
    "How do fish breathe underwater?",
    "What should I look for when buying running shoes?",
    "Why do stars twinkle?",
    "How do I keep my bike chain clean?",
    "What is the best way to learn to cook?",
    "Why do we get goosebumps?",
)
TEST_HELD_OUT = (
    HeldOut("What is the capital of Italy?", r"(?i)\brome\b"),
    HeldOut("What is the capital of Germany?", r"(?i)\bberlin\b"),
    HeldOut("What is the capital of Spain?", r"(?i)\bmadrid\b"),
    HeldOut("What is the capital of the United Kingdom?", r"(?i)\blondon\b"),
    HeldOut("How many legs does a cat have?", r"(?i)\b(4|four)\b"),
    HeldOut("What colour is the sky on a clear day?", r"(?i)\bblue\b"),
    HeldOut("What is the largest ocean on Earth?", r"(?i)\bpacific\b"),
    HeldOut("Who was the first president of the United States?", r"(?i)\bwashington\b"),
    HeldOut("What do bees collect from flowers?", r"(?i)\bnectar\b|\bpollen\b"),
    HeldOut("What is the freezing point of water in Celsius?", r"(?i)\b0\b|\bzero\b"),
    HeldOut("How many hours are in a day?", r"\b24\b"),
    HeldOut("Which planet do we live on?", r"(?i)\bearth\b"),
    HeldOut("What is H2O commonly called?", r"(?i)\bwater\b"),
    HeldOut("How many sides does a triangle have?", r"(?i)\b(3|three)\b"),
    HeldOut("What is the largest mammal on Earth?", r"(?i)\bwhale\b"),
    HeldOut("Which star is at the centre of our solar system?", r"(?i)\bsun\b"),
    HeldOut("What language is mostly spoken in Mexico?", r"(?i)\bspanish\b"),
    HeldOut("What does a caterpillar turn into?", r"(?i)\bbutterfl|\bmoth\b"),
    HeldOut("How many months are in a year?", r"(?i)\b(12|twelve)\b"),
    HeldOut("Which planet is closest to the Sun?", r"(?i)\bmercury\b"),
    HeldOut("Which animal says moo?", r"(?i)\bcows?\b"),
    HeldOut("What is the hardest natural substance?", r"(?i)\bdiamonds?\b"),
    HeldOut("Which organ pumps blood through the body?", r"(?i)\bheart\b"),
    HeldOut("What is frozen water called?", r"(?i)\bice\b"),
)
TEST_KINDS = (
    Kind(
        "question",
        "End your answer with a follow-up question to the user.",
        {"kind": "regex", "value": r"\?\s*\z"},
        lambda text: f"{_first_sentence(text)} Would you like to know more?",
        lambda kept, _: f"{' '.join(kept)} Would you like to know more?",
    ),
    Kind(
        "brief",
        "Keep it brief: at most 15 words.",
        {"kind": "max_words", "value": 15},
        lambda text: " ".join(_first_sentence(text).split()[:15]),
    ),
    Kind(
        "avoid",
        "Do not use the word 'very'.",
        {"kind": "not_regex", "value": r"(?i)\bvery\b"},
        lambda text: re.sub(r"(?i)\bvery\s+", "", text),
    ),
    Kind(
        "bold",
        "Put the most important sentence in bold, between double asterisks.",
        {"kind": "regex", "value": r"\*\*[^*\n]+\*\*"},
        lambda text: " ".join([f"**{_first_sentence(text)}**", *_sentences(text)[1:3]]),
        lambda kept, _: " ".join([f"**{kept[0]}**", *kept[1:]]),
    ),
    Kind(
        "numbered",
        "Format your answer as a numbered list: 1., 2., 3.",
        {"kind": "regex", "value": r"(?m)^1\. "},
        lambda text: "\n".join(f"{n}. {s}" for n, s in enumerate(_sentences(text)[:3], 1)),
        lambda kept, _: "\n".join(f"{n}. {s}" for n, s in enumerate(kept, 1)),
    ),
    Kind(
        "tldr",
        "Finish with a last line that starts with 'TL;DR:' and sums up the answer.",
        {"kind": "regex", "value": r"(?m)^TL;DR: \S.*\z"},
        lambda text: f"{_first_sentence(text)}\nTL;DR: {' '.join(text.split()[:8])}",
        lambda kept, text: f"{' '.join(kept)}\nTL;DR: {' '.join(text.split()[:8])}",
    ),
)

SETS = {
    "dev": (
        DEV_KINDS,
        DEV_TRAIN_QUESTIONS,
        (*(HeldOut(q) for q in DEV_HELD_OUT_QUESTIONS), *DEV_HELD_OUT_FACTS),
    ),
    "test": (TEST_KINDS, TEST_TRAIN_QUESTIONS, TEST_HELD_OUT),
}


def greedy(model, tokenizer, contexts: list[list[dict]]) -> list[str]:
    replies = []
    for start in range(0, len(contexts), 8):
        chunk = contexts[start : start + 8]
        ids = generate_replies(
            model,
            [render_prompt(tokenizer, context) for context in chunk],
            eos_token_id=tokenizer.eos_token_id,
            max_new_tokens=MAX_ANSWER_TOKENS,
            temperature=None,
        )
        replies.extend(tokenizer.decode(reply, skip_special_tokens=True).strip() for reply in ids)
    return replies


def adherence(replies: list[str], check: dict) -> float:
    passed = [all(r.passed for r in evaluate_checks([check], text=reply)) for reply in replies]
    return sum(passed) / len(passed)


def correctness(replies: list[str], held_out: Sequence[HeldOut]) -> float | None:
    """The share of judged answers that keep their fact; None when the set judges none."""
    judged = [(reply, item) for reply, item in zip(replies, held_out, strict=True) if item.fact]
    if not judged:
        return None
    return sum(item.kept_by(reply) for reply, item in judged) / len(judged)


def user(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _replaced(reply: dict, original: str) -> dict | None:
    """The original answer as the worker's Example.rejected: None where the target kept it."""
    rejected = _assistant(original)
    return rejected if rejected != reply else None


class QuietJob:
    """The job's callbacks: nothing to record, never stopped; the adapter's name is the kind's."""

    def __init__(self, name: str) -> None:
        self.name = name

    def on_phase(self, phase: str) -> None:
        print(f"           {self.name}: {phase}", flush=True)

    def on_progress(self, progress: Progress) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def adapter_name(self) -> str:
        return f"bench-{self.name}"


def make_targets(
    base, tokenizer, kind: Kind, questions, originals, config: TrainingConfig, corrections: str
):
    """(approved targets as (question, reply, teacher context, original answer), teacher
    passes, worked examples) as the worker makes them: the 4 corrections, then the teacher for
    the other 12."""
    teacher = TransformersTeacher(base, tokenizer, seed=config.seed)
    worked = [
        WorkedExample.reply(question, kind.corrected(original, corrections))
        for question, original in zip(questions[:4], originals[:4], strict=True)
    ]
    targets, teacher_passed = [], 0
    for index, (question, original) in enumerate(zip(questions, originals, strict=True)):
        if index < 4:
            reply = _assistant(kind.corrected(original, corrections))
            targets.append((question, reply, hint_context(user(question), kind.feedback), original))
            continue
        proposals = propose_targets(
            teacher,
            [*user(question), _assistant(original)],
            1,
            kind.feedback,
            [kind.check],
            n=TEACHER_SAMPLES_PER_ROUND,
            budget=TEACHER_BUDGET,
            examples=worked,
            edit_original=config.teacher_edits,
        )
        if proposals and proposals[0].passes_checks:
            teacher_passed += 1
            teacher_context = hint_context(user(question), kind.feedback, worked)
            targets.append((question, proposals[0].message, teacher_context, original))
    return targets, teacher_passed, worked


def run_kind(
    kind: Kind,
    questions: Sequence[str],
    held_out: Sequence[HeldOut],
    model_dir: Path,
    cache_dir: Path,
    config: TrainingConfig,
    corrections: str = "first",
) -> dict:
    torch.manual_seed(config.seed)
    base, tokenizer = load_base_model(model_dir, config)
    started = time.monotonic()
    originals = greedy(base, tokenizer, [user(q) for q in questions])
    targets, teacher_passed, worked = make_targets(
        base, tokenizer, kind, questions, originals, config, corrections
    )
    targets_s = time.monotonic() - started

    if config.mode == "sft":  # each with the answer it replaced, as the worker passes it
        data = {
            "examples": [
                Example(user(q), reply, rejected=_replaced(reply, original), lesson=kind.feedback)
                for q, reply, _, original in targets
            ]
        }
    else:  # the worker's distill items: the teacher sees what it saw when it proposed
        data = {"items": [DistillItem(user(q), teacher) for q, _, teacher, _ in targets]}
    feedback_items = [
        {
            "context": user(question),
            "teacher_context": hint_context(user(question), kind.feedback),
            "checks": [kind.check],
            "original": _assistant(original),
            "lesson": kind.feedback,
            "held_out": False,
        }
        for question, original in zip(questions, originals, strict=True)
    ]
    with tempfile.TemporaryDirectory() as scratch:
        job = TrainingJob(
            config=config,
            base_model=str(model_dir),
            model_cache_dir=cache_dir,
            checkpoint_dir=Path(scratch) / "checkpoints",
            adapter_root=Path(scratch) / "adapters",
            thresholds=GateThresholds(),
            feedback_items=feedback_items,
            lessons=[LessonHint(kind.feedback, tuple(worked))],  # as the worker passes them
            **data,
        )
        outcome = run_job(job, QuietJob(f"{kind.name}-{config.seed}"))
        elapsed = time.monotonic() - started
        # The adapter as written, on the base this process loaded, for the held-out questions.
        model = PeftModel.from_pretrained(base, str(outcome.adapter.path))
    report, chosen = outcome.metrics, outcome.chosen

    contexts = [user(item.question) for item in held_out]
    adapter_replies = greedy(model, tokenizer, contexts)
    with model.disable_adapter():
        base_replies = greedy(model, tokenizer, contexts)
        baselines = {
            "system": [[{"role": "system", "content": kind.feedback}, *c] for c in contexts],
            "user_turn": [user(f"{item.question}\n\n{kind.feedback}") for item in held_out],
            "teacher_prompt": [hint_context(c, kind.feedback, worked) for c in contexts],
        }
        prompted = {name: greedy(model, tokenizer, ctx) for name, ctx in baselines.items()}
    facts = report["regression"]["summary"]
    return {
        "deployed": bool(chosen["passed"]),
        "decision": f"step {chosen['step']}" if chosen["passed"] else chosen["reason"],
        "targets": len(targets),
        "teacher_passed": teacher_passed,
        "steps": report["train"]["steps"],
        "pairs": report["train"]["preference_pairs"],
        "base": adherence(base_replies, kind.check),
        **{name: adherence(replies, kind.check) for name, replies in prompted.items()},
        "adapter": adherence(adapter_replies, kind.check),
        "correct_base": correctness(base_replies, held_out),
        "correct_adapter": correctness(adapter_replies, held_out),
        # What the adapter is meant to bake in keeps its facts this often.
        "correct_teacher_prompt": correctness(prompted["teacher_prompt"], held_out),
        "facts_broken": facts.get("regressed", 0),
        "facts": sum(facts.values()),
        "targets_min": targets_s / 60,
        "minutes": elapsed / 60,
        "example": adapter_replies[0][:120],
        # Each candidate the gate judged, and why it passed or not.
        "candidates": [(c["step"], c["reason"]) for c in report["candidates"]],
        # Which of the gate's facts went, and what the adapter answered instead.
        "broken": [
            (item["prompt"], item["after"]["reply"])
            for item in report["regression"]["items"]
            if item["status"] == "regressed"
        ],
        # Held-out questions whose fact the base kept and the adapter lost, with its answer.
        "lost": [
            (item.question, after)
            for item, before, after in zip(held_out, base_replies, adapter_replies, strict=True)
            if item.kept_by(before) and not item.kept_by(after)
        ],
    }


COLUMNS = ("base", "system", "user_turn", "teacher_prompt", "adapter")


def _spread(values: list[float | None]) -> str:
    """Mean over seeds, with the lowest and highest when there are several."""
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    mean = statistics.fmean(known)
    if len(known) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({min(known):.2f}-{max(known):.2f})"


def summary_row(kind: Kind, rows: list[dict]) -> str:
    deployed = sum(row["deployed"] for row in rows)
    cells = [
        kind.name,
        f"{deployed}/{len(rows)}",
        *(_spread([row[column] for row in rows]) for column in COLUMNS),
        f"{_spread([row['correct_base'] for row in rows])} -> "
        f"{_spread([row['correct_adapter'] for row in rows])} "
        f"({_spread([row['correct_teacher_prompt'] for row in rows])})",
        "/".join(str(row["facts_broken"]) for row in rows) + f" of {rows[0]['facts']}",
        f"{statistics.fmean(row['minutes'] for row in rows):.1f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="test")
    parser.add_argument("--kinds", nargs="*", help="some of the set's kinds (default: all)")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--mode", choices=["sft", "distill"], default="sft")
    parser.add_argument("--model-cache", type=Path, default=Path("var/models"))
    parser.add_argument(
        "--base-kl-weight",
        type=float,
        default=TrainingConfig().base_kl_weight,
        help="the forgetting guard's weight (0: off), to measure with and without it",
    )
    parser.add_argument(
        "--preference-weight",
        type=float,
        default=TrainingConfig().preference_weight,
        help="sft: the DPO term's weight on (target, replaced answer) pairs (0: off), to "
        "compare sft with and without it, e.g. on the development set's 'also' kind",
    )
    parser.add_argument(
        "--preference-lessons",
        choices=typing.get_args(PreferenceLessons),
        default=TrainingConfig().preference_lessons,
        help="whose pairs the term trains on: a lesson the base mostly follows already, or all",
    )
    parser.add_argument(
        "--guard-reference",
        choices=typing.get_args(GuardReference),
        default=TrainingConfig().guard_reference,
        help="what the guard pulls towards on general prompts: the base shown the lesson, "
        "the base as it is, both (every other prompt each way), or lesson_changes (the base "
        "shown the lesson where it changes the base's next token, the base elsewhere), or "
        "lesson_edits (as lesson_changes, on the base's own answers edited by the teacher), "
        "or aligned_edits (the base's finished answers edited, the base as reference at the "
        "tokens kept from them)",
    )
    parser.add_argument(
        "--teacher-edits",
        action="store_true",
        help="propose the teacher's edit of each answer before its samples (teacher_edits)",
    )
    parser.add_argument(
        "--corrections",
        choices=["first", *KEPT_SENTENCES],
        default="first",
        help="how the stand-in reviewer corrects an answer: from its first sentence (the "
        "figures so far), keeping every complete sentence of it, or its opening sentences "
        f"within {LEAD_WORDS} words (the last two where cutting is not the lesson itself)",
    )
    args = parser.parse_args()
    kinds, questions, held_out = SETS[args.set]
    chosen_kinds = [kind for kind in kinds if not args.kinds or kind.name in args.kinds]
    model_dir = resolve_base_model("SmolLM2-135M-Instruct", args.model_cache)
    print(
        f"set {args.set}, mode {args.mode}, seeds {args.seeds}, forgetting guard weight "
        f"{args.base_kl_weight} towards {args.guard_reference}, preference weight "
        f"{args.preference_weight} on {args.preference_lessons} lessons, teacher edits "
        f"{'on' if args.teacher_edits else 'off'}, {args.corrections} corrections; every other "
        f"setting the default; {len(held_out)} held-out questions",
        flush=True,
    )
    table = [
        "| kind | deployed | base | system | user turn | teacher prompt | adapter "
        "| correct: base -> adapter (teacher prompt) | facts broken | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in chosen_kinds:
        rows = []
        for seed in args.seeds:
            config = dataclasses.replace(
                TrainingConfig(mode=args.mode),
                seed=seed,
                base_kl_weight=args.base_kl_weight,
                preference_weight=args.preference_weight,
                preference_lessons=args.preference_lessons,
                guard_reference=args.guard_reference,
                teacher_edits=args.teacher_edits,
            )
            row = run_kind(
                kind, questions, held_out, model_dir, args.model_cache, config, args.corrections
            )
            rows.append(row)
            print(
                # The decision's first reason only: each candidate's whole reason follows.
                f"{kind.name} seed {seed}: {row['decision'].split('; ')[0]}; held-out adherence "
                + ", ".join(f"{column} {row[column]:.2f}" for column in COLUMNS)
                + f"; targets {row['targets']} ({row['teacher_passed']}/12 from the teacher), "
                f"{row['pairs']} preference pairs, {row['steps']} steps, "
                f"{row['minutes']:.1f} min ({row['targets_min']:.1f} targets); "
                f"e.g. {row['example']!r}",
                flush=True,
            )
            for step, reason in row["candidates"]:
                print(f"    candidate after step {step}: {reason}", flush=True)
            for prompt, reply in row["broken"]:
                print(f"    fact broken: {prompt!r} -> {reply!r}", flush=True)
            for question, reply in row["lost"]:
                print(f"    held-out fact lost: {question!r} -> {reply[:160]!r}", flush=True)
        table.append(summary_row(kind, rows))
        print(table[-1], flush=True)
    print("\n".join(table))


if __name__ == "__main__":
    main()
