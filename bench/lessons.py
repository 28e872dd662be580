"""Lesson after lesson: does each retrain keep what the earlier ones taught?

Run from the repository root, in the project's virtualenv, with PostgreSQL and Redis reachable
and vLLM serving the bundled model (`python manage.py serve_model`, or pass --vllm-url):

    python bench/lessons.py                        # 4 compatible lessons, then a contradicting pair
    python bench/lessons.py --lessons 2 --per-lesson 8
    python bench/lessons.py --start-from base      # each retrain from the base, not what serves
    python bench/lessons.py --retrain-after 1 2 4 --min-steps 48   # two new lessons in one retrain
    python bench/lessons.py --guard-keeps base     # the guard holds each retrain to the base
    python bench/lessons.py --guard-reference lesson_edits   # replay: the base's answers, edited
    python bench/lessons.py --teacher-edits        # the teacher's edit of each answer proposed
    python bench/lessons.py --teacher-model SmolLM2-135M-Instruct   # the base writes targets

It starts the product (bench/product.py: web, worker, a scratch database; vLLM serves the
project's model, teaches and answers the gate) on default settings but one: "checks pass"
approval, standing in for a reviewer who approves the teacher's best passing revision. Then, one
lesson at a time, as a team gives them over weeks:
1. a harness asks the project's alias (whatever serves now) --per-lesson questions through the
   gateway, one trace each;
2. every answer gets the lesson's feedback and check over the API; --corrections of those that
   read as answers (not a count, not garbled) also a corrected answer, written the way the team
   writes now (this lesson and every earlier one);
3. the worker proposes targets; Retrain, as the button does (POST /api/v1/runs);
4. the lessons ledger (GET /api/v1/lessons): every lesson's held-out adherence in every version.
After every retrain it prints the ledger as a table, with the run's outcome, the facts it broke
and the retrain's minutes (how the time grows as lessons pile up). Last, two lessons that
contradict each other ("answer in one word", "explain step by step") are given together, and the
contradiction the run's plan found is printed before that run trains.
The bar (issue: lesson after lesson): each earlier lesson keeps at least 90% of the adherence it
had when first learned; facts kept; the contradicting pair reported as a conflict.
"""

import argparse
import re
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import psycopg
from product import (
    PROXY_HEADERS,
    add_product_arguments,
    run_to_the_end,
    running_product,
    screenshot,
    wait_for,
)

from training.chat import message_text
from training.config import GuardKeeps, GuardReference, StartFrom, TrainingConfig
from training.readability import looks_garbled

BENCH_DATABASE = "apprentice_bench_lessons"
ALIAS = "team-agent"
MAX_ANSWER_TOKENS = 96
TARGETS_TIMEOUT_S = 3600.0  # the teacher samples up to 16 revisions per feedback on CPU


def _sentences_within(text: str, most: int) -> str:
    """The answer's first sentences that fit in `most` words, as a reviewer shortens an answer;
    a first sentence longer than that is cut and closed with a full stop. (Cutting every answer
    at `most` words taught "end with 'Hope this helps.'" to stop mid-sentence: the teacher
    copied the cut corrections, and no run learned it.)"""
    kept: list[str] = []
    for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
        if len(" ".join([*kept, sentence]).split()) > most:
            break
        kept.append(sentence)
    if kept:
        return " ".join(kept)
    return " ".join(text.split()[:most]).rstrip(",;:") + "."


@dataclass(frozen=True)
class Lesson:
    name: str
    feedback: str
    check: dict
    # How a reviewer writes an answer to follow this lesson, from the answer they were shown.
    apply: Callable[[str], str]


# Compatible: one answer can follow all four. Applied to a correction in this order.
LESSONS = (
    Lesson(
        "plain",
        "Do not use the word 'very'.",
        {"kind": "not_regex", "value": r"(?i)\bvery\b"},
        lambda text: re.sub(r"(?i)\bvery\s+", "", text),
    ),
    Lesson(
        "short",
        "Keep your answer under 40 words.",
        {"kind": "max_words", "value": 40},
        lambda text: _sentences_within(text, 32),
    ),
    Lesson(
        "prefix",
        "Always begin your answer with 'Answer:'.",
        {"kind": "regex", "value": r"^Answer:"},
        lambda text: text if text.startswith("Answer:") else f"Answer: {text}",
    ),
    Lesson(
        "ending",
        "End every answer with the sentence 'Hope this helps.'",
        {"kind": "regex", "value": r"Hope this helps\.?\s*\z"},
        lambda text: f"{text.rstrip()} Hope this helps.",
    ),
)
# Contradicting: what follows one breaks the other.
CONTRADICTING = (
    Lesson(
        "one-word",
        "Answer in one word.",
        {"kind": "max_words", "value": 1},
        lambda text: (text.split() or ["Yes"])[0].strip(".,!?:;"),
    ),
    Lesson(
        "step-by-step",
        "Explain your reasoning step by step, in at least three sentences.",
        {"kind": "regex", "value": r"(?s)[.!?].+[.!?].+[.!?]"},
        lambda text: (
            f"First, {text.rstrip('.')}. Second, that follows from the question. "
            "Finally, that is the answer."
        ),
    ),
)
QUESTIONS = (
    "Why do we need to drink water?", "How do I start a vegetable garden?",
    "What is a good habit for saving money?", "Why do birds sing in the morning?",
    "How can I sleep better at night?", "What makes bread rise?",
    "How do I learn to swim as an adult?", "Why do leaves fall in autumn?",
    "What is a simple way to reduce stress?", "How do magnets work?",
    "Why is breakfast important?", "How do I make my phone battery last longer?",
    "What should I bring on a long hike?", "Why do we dream?",
    "How do I pick a ripe avocado?", "What is the best way to study for an exam?",
    "Why does ice float on water?", "How do I keep my kitchen knives sharp?",
    "What is a good way to meet new people?", "Why do we see lightning before thunder?",
    "How can I stop procrastinating?", "What makes a good password?",
    "How do plants know which way is up?", "Why do cats like boxes?",
    "How do I make a cup of coffee without a machine?", "What causes hiccups?",
    "How do I choose a good book to read?", "Why is the sea blue?",
    "How do I remove a coffee stain?", "What is the easiest pet to care for?",
    "Why do we have fingerprints?", "How do I stay warm in winter without heating?",
    "What is a healthy snack?", "How do bridges stay up?",
    "Why do onions smell strong?", "How can I improve my posture?",
    "What makes popcorn pop?", "How do I write a good thank-you note?",
    "Why do we get tired after eating?", "How do I keep flowers fresh in a vase?",
    "What is the best way to learn to type?", "Why do dogs sniff everything?",
    "How do I make my room cooler in summer?", "What causes a sunburn?",
    "How do I clean a computer keyboard?", "Why do people snore?",
    "How do I cook rice on the stove?", "What makes a rainbow curved?",
    "How can I be a better listener?", "Why do apples turn brown when cut?",
    "How do I fold a shirt neatly?", "What is a good first instrument to learn?",
    "Why do we shiver?", "How do I plan a small party?",
    "What makes soap clean things?", "How do I stop my glasses fogging up?",
    "Why do stars come out at night?", "How can I drink less coffee?",
    "What is a good stretch after sitting all day?", "Why is the moon out in the day?",
    "How do I wash a wool sweater?", "Why do we yawn?",
    "What is a good way to remember names?", "How do hot air balloons fly?",
    "Why does bread get moldy?", "How do I start journaling?",
    "What makes thunderstorms happen?", "How do I keep a cut flower garden?",
    "Why do our ears pop on a plane?", "How can I make new habits stick?",
    "What is the best way to defrost food?", "Why do zebras have stripes?",
)  # fmt: skip


def ask(product, trace_id: str, question: str) -> None:
    """One harness call through the gateway: the project's alias answers, one trace."""
    response = httpx.post(
        f"{product.gateway}/chat/completions",
        json={
            "model": ALIAS,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": MAX_ANSWER_TOKENS,
            "temperature": 0,
        },
        headers={"Authorization": f"Bearer {product.key}", "X-Trace-Id": trace_id,
                 **PROXY_HEADERS},
        timeout=300,
    )  # fmt: skip
    response.raise_for_status()


def recorded_answer(api: httpx.Client, trace_id: str) -> str:
    """The answer the gateway recorded (it records off the request path, so wait for it)."""

    def stored():
        response = api.get(f"/api/v1/traces/{trace_id}")
        return response.json() if response.status_code == 200 else None

    trace = wait_for(stored, 60, f"the gateway to record {trace_id}")
    return trace["messages"][-1]["content"] or ""


def give_lesson(product, lesson: Lesson, questions, corrections: int, style) -> list[str]:
    """Feedback (and some corrections) on fresh traces; the trace ids."""
    trace_ids = []
    corrected = 0
    for number, question in enumerate(questions):
        trace_id = f"{lesson.name}-{number}"
        ask(product, trace_id, question)
        answer = recorded_answer(product.api, trace_id)
        body = {"text": lesson.feedback, "turn": 1, "checks": [lesson.check]}
        # The stand-in reviewer corrects an answer by restyling it, so it corrects only answers
        # worth keeping: a person would rewrite "Answer: 1. 1. 2. 3. ...", not append to it.
        if corrected < corrections and not looks_garbled(answer):
            body["correction"] = {"role": "assistant", "content": style(answer)}
            corrected += 1
        response = product.api.post(f"/api/v1/traces/{trace_id}/feedback", json=body)
        response.raise_for_status()
        trace_ids.append(trace_id)
    return trace_ids


def wait_for_targets(api: httpx.Client, trace_ids: list[str]) -> dict[str, int]:
    """Until the worker has made targets (or given up) for every feedback: statuses counted."""

    def statuses():
        found = {}
        for trace_id in trace_ids:
            feedback = api.get(f"/api/v1/traces/{trace_id}").json()["review"]["feedback"]
            found[trace_id] = feedback[0]["status"]
        return found if "open" not in found.values() else None

    found = wait_for(statuses, TARGETS_TIMEOUT_S, "targets for every feedback")
    counts: dict[str, int] = {}
    for status in found.values():
        counts[status] = counts.get(status, 0) + 1
    return counts


def print_ledger(api: httpx.Client, run: dict, minutes: float, after: str) -> None:
    lessons = api.get("/api/v1/lessons").json()["lessons"]
    regression = run["eval"].get("regression") or {}
    facts = regression.get("summary") or {}
    lost = (regression.get("facts") or {}).get("lost_from_base") or []
    phases = run["eval"].get("phase_seconds") or {}  # where the minutes went
    print(
        f"\nafter {after}: run {run['status']} ({run.get('error') or 'no error'}); adapter "
        f"{run['adapter']}; {facts.get('regressed', 0)} of {sum(facts.values())} facts broken "
        f"against what serves, {len(lost)} lost since the base{': ' if lost else ''}"
        f"{'; '.join(lost)}; {minutes:.1f} min click -> end"
        + "".join(f", {seconds:.0f} s {phase}" for phase, seconds in phases.items()),
        flush=True,
    )
    # A lesson given later has no entry for the versions before it: those cells stay "-".
    versions = sorted({entry["version"] for lesson in lessons for entry in lesson["versions"]})
    print("| lesson | first learned by (adherence) | "
          + " | ".join(f"v{version}" for version in versions) + " | state |")  # fmt: skip
    for lesson in lessons:
        by_version = {entry["version"]: _adherence(entry) for entry in lesson["versions"]}
        cells = [
            lesson["text"][:40],
            f"{lesson['first_learned_by'] or '-'} ({_share(lesson['first_learned_adherence'])})",
            *(_share(by_version.get(version)) for version in versions),
            lesson["state"],
        ]
        print("| " + " | ".join(cells) + " |", flush=True)


def _adherence(entry: dict) -> float | None:
    return entry["held_out"] if entry["held_out"] is not None else entry["trained"]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_targets(api: httpx.Client, lesson: Lesson, most: int = 4) -> None:
    """What the newest lesson's run will train on: its first approved targets, as written."""
    groups = api.get("/api/v1/targets", params={"state": "approved", "limit": 200}).json()
    chosen = [
        proposal
        for group in groups["feedback"]
        if group["feedback"] == lesson.feedback
        for proposal in group["proposals"]
        if proposal["id"] == group["chosen"]
    ]
    print(f"{len(chosen)} approved targets for {lesson.name!r}, the first {most}:")
    for proposal in chosen[:most]:
        print(f"  [{proposal['source']}] {message_text(proposal['target'])!r}")


def run_items(product, run: dict) -> tuple[list[dict], list[dict], list[dict]]:
    """A run's per-item results: trained, held out and regression prompts. The API leaves
    them out of a run's `eval` (they are large), so they are read from the scratch database
    the bench made."""
    with psycopg.connect(product.env["DATABASE_URL"]) as connection:
        row = connection.execute(
            "SELECT metrics -> 'items', metrics -> 'held_out' -> 'items', "
            "metrics -> 'regression' -> 'items' FROM reviewapp_trainingrun WHERE id = %s",
            [run["id"]],
        ).fetchone()
    return (row[0] or [], row[1] or [], row[2] or []) if row else ([], [], [])


def print_unlearned(product, run: dict, lesson: Lesson, most: int = 4) -> None:
    """The newest lesson's trained items the candidate still fails, and how its answers end."""
    trained, _, _ = run_items(product, run)
    items = [
        item
        for item in trained
        if item.get("lesson") == lesson.feedback and not item["after"]["passed"]
    ]
    print(f"{len(items)} trained items of {lesson.name!r} failing after, the first {most}:")
    for item in items[:most]:
        print(f"  trace {item.get('trace_id')}: ...{item['after']['reply'][-160:]!r}")


def print_regressed(product, run: dict) -> None:
    """Every item that passed under what serves and fails under the candidate (what the gate
    counts against `max_regressed`), and every fact it broke, with both answers."""
    trained, held_out, regression = run_items(product, run)
    for section, items in (("trained", trained), ("held out", held_out), ("fact", regression)):
        for item in items:
            if item.get("status") != "regressed":
                continue
            before, after = item["before"]["reply"], item["after"]["reply"]
            what = (item.get("lesson") or item.get("prompt") or "")[:40]
            print(f"  regressed ({section}) {what!r} trace {item.get('trace_id')}: "
                  f"{len(before.split())} -> {len(after.split())} words\n"
                  f"    before: {before!r}\n    after:  {after!r}")  # fmt: skip


def retrain(
    product, after: str, max_seconds: float, new: tuple[Lesson, ...] = (), ledger_shot: str = ""
) -> dict:
    run, timeline, _ = run_to_the_end(product.api, {"mode": "sft"}, max_seconds)
    print_ledger(product.api, run, max(timeline.values()) / 60, after)
    print_regressed(product, run)
    for lesson in new:
        print_unlearned(product, run, lesson)
    if ledger_shot and run.get("adapter"):  # the candidate's page, refused or not
        adapters = product.api.get("/api/v1/adapters").json()["adapters"]
        version = next(a["version"] for a in adapters if a["name"] == run["adapter"])
        screenshot(product, ledger_shot, f"adapters/{version}", "#lessons")
        print(f"the ledger on {run['adapter']}'s page: {ledger_shot}", flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lessons", type=int, default=len(LESSONS), help="compatible lessons")
    parser.add_argument("--per-lesson", type=int, default=12, help="reviewed traces per lesson")
    parser.add_argument("--corrections", type=int, default=3, help="corrected of those")
    parser.add_argument("--skip-contradiction", action="store_true")
    parser.add_argument(
        "--start-from",
        choices=typing.get_args(StartFrom),
        default=TrainingConfig().start_from,
        help="where each retrain starts: the serving adapter's weights or the base's",
    )
    parser.add_argument(
        "--guard-keeps",
        choices=typing.get_args(GuardKeeps),
        default=TrainingConfig().guard_keeps,
        help="whom the forgetting guard holds a retrain to: the adapter it starts from, the base",
    )
    parser.add_argument(
        "--guard-reference",
        choices=typing.get_args(GuardReference),
        default=TrainingConfig().guard_reference,
        help="the guard's reference on general prompts (training/config.py guard_reference)",
    )
    parser.add_argument(
        "--teacher-edits",
        action="store_true",
        help="propose the teacher's edit of each answer before its samples (teacher_edits)",
    )
    parser.add_argument(
        "--teacher-model",
        default="",
        help="the model name on the model server that writes revision targets (teacher.model; "
        "blank: the project's own, what serves; the base's name: the base without its adapter)",
    )
    parser.add_argument(
        "--ledger-screenshot",
        default="",
        help="after each retrain, capture the lessons ledger on its adapter's page to this PNG",
    )
    add_product_arguments(parser)
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="per retrain")
    parser.add_argument(
        "--retrain-after",
        type=int,
        nargs="*",
        help="retrain once this many lessons are given (default: after each); 1 2 4 gives "
        "the third and fourth lessons to one retrain",
    )
    parser.add_argument(
        "--min-steps",
        type=int,
        default=TrainingConfig().min_steps,
        help="the project's training.min_steps: the fewest updates a retrain makes",
    )
    args = parser.parse_args()
    needed = args.per_lesson * (args.lessons + len(CONTRADICTING))
    if not 1 <= args.lessons <= len(LESSONS) or needed > len(QUESTIONS):
        parser.error(f"at most {len(LESSONS)} lessons and {len(QUESTIONS)} questions in all")
    retrain_after = set(args.retrain_after or range(1, args.lessons + 1))
    if not retrain_after <= set(range(1, args.lessons + 1)) or args.lessons not in retrain_after:
        parser.error(f"--retrain-after: counts of 1 to {args.lessons}, {args.lessons} among them")

    with running_product(
        admin_url=args.admin_url,
        database=BENCH_DATABASE,
        vllm_url=args.vllm_url,
        redis_url=args.redis_url,
        alias=ALIAS,
    ) as product:
        product.api.patch(
            "/api/v1/settings",
            json={
                "auto_approve": "checks_pass",
                "teacher": {"model": args.teacher_model},
                "training": {
                    "start_from": args.start_from,
                    "min_steps": args.min_steps,
                    "guard_keeps": args.guard_keeps,
                    "guard_reference": args.guard_reference,
                    "teacher_edits": args.teacher_edits,
                },
            },
        ).raise_for_status()
        print(f"every retrain starts from {args.start_from}, {args.min_steps} updates at least, "
              f"the guard keeping {args.guard_keeps} on {args.guard_reference} replay; "
              f"teacher edits {'on' if args.teacher_edits else 'off'}, the teacher "
              f"{args.teacher_model or 'what serves'}; "
              f"retrains after lessons {sorted(retrain_after)}", flush=True)  # fmt: skip
        questions = iter(QUESTIONS)
        given: list[Lesson] = []
        new: list[Lesson] = []  # given since the last retrain
        for lesson in LESSONS[: args.lessons]:
            given.append(lesson)
            new.append(lesson)
            style = _style(given)
            batch = [next(questions) for _ in range(args.per_lesson)]
            started = time.monotonic()
            trace_ids = give_lesson(product, lesson, batch, args.corrections, style)
            counts = wait_for_targets(product.api, trace_ids)
            print(f"\nlesson {lesson.name!r}: feedback {counts} after "
                  f"{(time.monotonic() - started) / 60:.1f} min", flush=True)  # fmt: skip
            print_targets(product.api, lesson)
            if len(given) in retrain_after:
                names = " and ".join(lesson.name for lesson in new)
                after = f"lesson {len(given)} ({names})"
                retrain(product, after, args.max_seconds, tuple(new), args.ledger_screenshot)
                new = []
        if args.skip_contradiction:
            return
        trace_ids = []
        for lesson in CONTRADICTING:
            batch = [next(questions) for _ in range(args.per_lesson)]
            trace_ids += give_lesson(product, lesson, batch, args.corrections, lesson.apply)
        wait_for_targets(product.api, trace_ids)
        run = retrain(product, "the contradicting pair", args.max_seconds)
        conflicts = run["plan"].get("conflicts") or []
        print(f"\ncontradictions the run's plan reported: {len(conflicts)}")
        for conflict in conflicts:
            print(f"  {conflict}")


def _style(lessons: list[Lesson]) -> Callable[[str], str]:
    """How the team writes a corrected answer once it has given these lessons."""
    order = [lesson for lesson in LESSONS if lesson in lessons]

    def write(text: str) -> str:
        for lesson in order:
            text = lesson.apply(text)
        return text

    return write


if __name__ == "__main__":
    main()
