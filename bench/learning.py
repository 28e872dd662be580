"""Does the loop teach? Per feedback kind, what a reviewed batch does to held-out prompts.

Run from the repository root, in the project's virtualenv:

    python bench/learning.py                       # all kinds
    python bench/learning.py --kinds prefix words  # some of them
    python bench/learning.py --base-kl-weight 0    # the same without the forgetting guard

For each kind of feedback (form, length, ending, tone, content, format), as a team would give it:
- 16 questions answered by the bundled SmolLM2-135M-Instruct (greedy, as served); each answer
  gets the same written feedback with a machine check; 4 of the 16 also get a corrected answer
  (written from the original answer, as a reviewer would);
- targets as the worker makes them: corrections as they are, the teacher (the base model shown
  the feedback, after the 4 corrections as worked examples) sampled until a revision passes the
  check or 16 samples are spent, the best passing one approved ("checks pass" auto-approve);
- one run with default settings (TrainingConfig()), the forgetting guard's replay set included,
  then the gate as the worker runs it (training/candidates.py: the final adapter, then an
  earlier checkpoint when the final one fails; the one that passes is what would deploy);
- 8 held-out questions never reviewed: adherence to the feedback of the base, of the base with
  the feedback as its system prompt (what a user would try first) and of the adapter; and the
  general regression facts, base vs adapter.

The same library code as the worker (no Django, no vLLM: generation is transformers' greedy
decoding, like the gate). Times are this process's wall clock on this machine, from the first
teacher call to the gate's decision; with vLLM serving the teacher, targets come faster.
"""

import argparse
import dataclasses
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.base_models import resolve_base_model
from training.candidates import choose_candidate
from training.chat import render_prompt
from training.checks import evaluate_checks
from training.config import TrainingConfig
from training.eval_sets import general_regression_items
from training.evaluation import evaluate_adapter
from training.gate import GateThresholds
from training.replay import base_replay_examples
from training.sampling import generate_replies
from training.targets import TransformersTeacher, WorkedExample, hint_context, propose_targets
from training.trainer import Example, add_lora, load_base_model, train

TRAIN_QUESTIONS = (
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
HELD_OUT_QUESTIONS = (
    "Why does bread go stale?",
    "How do birds know where to migrate?",
    "What is a good gift for a friend who likes cooking?",
    "Why is the ocean salty?",
    "How do I make my room less cluttered?",
    "What causes thunder?",
    "How can I remember names better?",
    "Why do onions make you cry?",
)
MAX_ANSWER_TOKENS = 96


@dataclass(frozen=True)
class Kind:
    name: str
    feedback: str
    check: dict
    correct: Callable[[str], str]  # a reviewer's corrected answer, from the original one


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]


KINDS = (
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
    ),
    Kind(
        "bullets",
        "Format the answer as a bulleted list, each line starting with '- '.",
        {"kind": "regex", "value": r"^- "},
        lambda text: "\n".join(f"- {s}" for s in re.split(r"(?<=[.!?])\s", text.strip())[:3]),
    ),
)


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
    passed = [
        all(r.passed for r in evaluate_checks([check], text=reply))
        for reply in replies
    ]
    return sum(passed) / len(passed)


def user(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def run_kind(kind: Kind, model_dir: Path, cache_dir: Path, config: TrainingConfig) -> dict:
    base, tokenizer = load_base_model(model_dir, config)
    started = time.monotonic()
    originals = greedy(base, tokenizer, [user(q) for q in TRAIN_QUESTIONS])

    # Targets: 4 corrections, the teacher for the other 12 (best passing proposal, if any),
    # shown the corrections as worked examples, as the worker shows a project's corrections
    # under the same feedback.
    teacher = TransformersTeacher(base, tokenizer)
    worked = [
        WorkedExample(question=question, answer=kind.correct(original))
        for question, original in zip(TRAIN_QUESTIONS[:4], originals[:4], strict=True)
    ]
    examples, teacher_passed = [], 0
    for index, (question, original) in enumerate(zip(TRAIN_QUESTIONS, originals, strict=True)):
        if index < 4:
            examples.append(Example(user(question), _assistant(kind.correct(original))))
            continue
        messages = [*user(question), _assistant(original)]
        proposals = propose_targets(
            teacher,
            messages,
            1,
            kind.feedback,
            [kind.check],
            n=4,
            budget=16,
            max_tokens=MAX_ANSWER_TOKENS,
            examples=worked,
        )
        if proposals and proposals[0].passes_checks:
            teacher_passed += 1
            examples.append(Example(user(question), proposals[0].message))
    targets_s = time.monotonic() - started

    replay = base_replay_examples(base, tokenizer, cache_dir=cache_dir)[: config.replay_examples]
    model = add_lora(base, config)
    feedback_items = [
        {
            "context": user(question),
            "teacher_context": hint_context(user(question), kind.feedback),
            "checks": [kind.check],
            "original": _assistant(original),
            "held_out": False,
        }
        for question, original in zip(TRAIN_QUESTIONS, originals, strict=True)
    ]
    regression_items = general_regression_items()
    base_side: dict = {}  # the base's replies, answered once for every candidate
    with tempfile.TemporaryDirectory() as checkpoints:  # the default run writes checkpoints
        result = train(
            model,
            tokenizer,
            config,
            examples=examples,
            replay=replay,
            checkpoint_dir=Path(checkpoints),
        )
        report, candidates = choose_candidate(
            model,
            config,
            result,
            evaluate=lambda: evaluate_adapter(
                model, tokenizer, feedback_items, regression_items, base_side
            ),
            thresholds=GateThresholds(),
        )
    chosen = next(candidate for candidate in candidates if candidate["chosen"])
    elapsed = time.monotonic() - started

    held_out = [user(q) for q in HELD_OUT_QUESTIONS]
    adapter_replies = greedy(model, tokenizer, held_out)
    with model.disable_adapter():
        base_replies = greedy(model, tokenizer, held_out)
        prompted = greedy(
            model, tokenizer, [[{"role": "system", "content": kind.feedback}, *c] for c in held_out]
        )
    regression = report["regression"]["summary"]
    return {
        "kind": kind.name,
        "targets": f"{len(examples)} (4 corrections + {teacher_passed}/12 from the teacher)",
        "steps": result.steps,
        "deployed": (
            f"yes (step {chosen['step']})" if chosen["passed"] else f"no: {chosen['reason']}"
        ),
        "candidates": "; ".join(
            f"step {c['step']}: {'passed' if c['passed'] else c['reason']}" for c in candidates
        ),
        "base": adherence(base_replies, kind.check),
        "system_prompt": adherence(prompted, kind.check),
        "adapter": adherence(adapter_replies, kind.check),
        "facts_broken": regression.get("regressed", 0),
        "facts": sum(regression.values()),
        "targets_min": targets_s / 60,
        "minutes": elapsed / 60,
        "example": adapter_replies[0][:120],
    }


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="*", default=[kind.name for kind in KINDS])
    parser.add_argument("--model-cache", type=Path, default=Path("var/models"))
    parser.add_argument(
        "--base-kl-weight",
        type=float,
        default=TrainingConfig().base_kl_weight,
        help="the forgetting guard's weight (0: off), to measure with and without it",
    )
    args = parser.parse_args()
    config = dataclasses.replace(TrainingConfig(), base_kl_weight=args.base_kl_weight)
    print(f"forgetting guard weight {config.base_kl_weight}; every other setting the default")
    torch.manual_seed(0)
    model_dir = resolve_base_model("SmolLM2-135M-Instruct", args.model_cache)
    print(
        "kind       deployed  held-out adherence: base -> adapter (system prompt)  "
        "facts broken  targets  steps  minutes (targets)"
    )
    for kind in KINDS:
        if kind.name not in args.kinds:
            continue
        row = run_kind(kind, model_dir, args.model_cache / "replay", config)
        print(
            f"{row['kind']:<10} {row['deployed'][:60]:<9} {row['base']:.2f} -> {row['adapter']:.2f}"
            f" ({row['system_prompt']:.2f})  {row['facts_broken']}/{row['facts']}  "
            f"{row['targets']}  {row['steps']}  {row['minutes']:.1f} ({row['targets_min']:.1f})",
            flush=True,
        )
        print(f"           candidates: {row['candidates']}", flush=True)
        print(f"           e.g. {row['example']!r}", flush=True)


if __name__ == "__main__":
    main()
