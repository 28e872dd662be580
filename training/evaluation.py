"""The evaluation gate: the same prompts answered by what serves now and by the candidate.

Per item: greedy replies from the serving side (the deployed adapter, loaded beside the
candidate as a second adapter named SERVING_ADAPTER; the base, adapter disabled, where none
serves) and the candidate (its adapter on), the item's checks on each, and a status:
- fixed: failed before, passes now;     - still failing: failed before and now;
- regressed: passed before, fails now;  - still passing: passed before and now.
Feedback items may carry the teacher context (the feedback as a hint): the divergence between
student and teacher (the base shown the feedback) on the student's own reply, before and after,
shows whether training closed the gap. Regression items may carry an approved reply: the
student's divergence from the base on it shows drift. Feedback items carry their lesson (the
feedback's text), and the report counts each lesson apart. Results are plain dicts, ready to
store as JSON.
"""

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from peft import PeftModel
from transformers import PreTrainedTokenizerBase

from training.chat import (
    assistant_message_from_text,
    build_example,
    message_text,
    render_prompt,
)
from training.eval_sets import feedback_kind
from training.gate import adherence
from training.losses import per_token_topk_tail_kl
from training.readability import reply_looks_garbled
from training.repliers import InProcessReplier, Replier
from training.sampling import active_adapter, adapter_disabled, reply_logits, weights_of
from training.targets import run_checks

STATUSES = ("fixed", "still failing", "regressed", "still passing")

# The peft adapter name the serving adapter is loaded under, beside the candidate's "default".
SERVING_ADAPTER = "serving"
CANDIDATE_ADAPTER = "default"  # peft's name for the adapter add_lora made

# Greedy replies long enough for the feedback's checks and the original answers (a check on
# how an answer ends fails on any reply cut short), bounded so one rambling item costs little.
MIN_EVAL_TOKENS = 48
MAX_EVAL_TOKENS = 160


def divergence(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, k: int
) -> list[float]:
    """Per item, KL(teacher || student) (top-k + tail) averaged over its reply tokens.

    Logits [B, R, V] aligned on the reply (see training.sampling.reply_logits), mask [B, R].
    """
    per_token = per_token_topk_tail_kl(student_logits, teacher_logits, k)
    weights = mask.to(per_token.dtype)
    return (per_token * weights).sum(dim=1).div(weights.sum(dim=1).clamp_min(1.0)).tolist()


def status(passed_before: bool, passed_after: bool) -> str:
    """One of STATUSES for an item's check results before and after training."""
    if passed_after:
        return "still passing" if passed_before else "fixed"
    return "regressed" if passed_before else "still failing"


def compare_replies(
    model: PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[dict[str, Any]],
    *,
    max_new_tokens: int | None = None,
    k: int = 20,
    batch_size: int = 8,
    base_cache: dict | None = None,
    replier: Replier | None = None,
    serving: str | None = None,
) -> list[dict[str, Any]]:
    """Before/after results for items `{"context", "checks"?, "tools"?, "teacher_context"?,
    "reference"?, "original"?}` (reference: an approved assistant message for the context;
    original: the answer the feedback was about, which sizes the generation budget unless
    `max_new_tokens` fixes it).

    `base_cache`: the before side (the serving adapter's or the base's greedy replies and their
    divergence from the teacher) is the same for every candidate adapter of a run; pass one
    dict to each evaluation and it is computed once. `replier` writes the greedy replies
    (default: in this process); the divergence and drift are measured here either way.
    `serving`: the name of the loaded adapter that answers the before side (None: the base
    answers it). `batch_size`: items whose divergence is measured together (each holds the
    full-vocabulary logits of every reply token, so it stays smaller than a generation batch)."""
    base_cache = {} if base_cache is None else base_cache
    replier = replier or InProcessReplier(tokenizer.eos_token_id)
    budgets = [
        max_new_tokens or generation_budget(tokenizer, item.get("original")) for item in items
    ]
    prompts = [render_prompt(tokenizer, item["context"], item.get("tools")) for item in items]
    before_key = ("replies", tuple(map(tuple, prompts)), tuple(budgets))
    if before_key not in base_cache:
        with active_adapter(model, serving):
            base_cache[before_key] = replier.greedy_replies(
                model, prompts, budgets, adapter_on=serving is not None
            )
    replies_before = base_cache[before_key]
    replies_after = replier.greedy_replies(model, prompts, budgets, adapter_on=True)

    # Items of similar reply lengths measured together: a batch pads to its longest.
    order = sorted(range(len(items)), key=lambda index: budgets[index])
    results: list[dict[str, Any]] = [{} for _ in items]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = _compare_batch(
            model,
            tokenizer,
            [items[i] for i in chunk],
            [prompts[i] for i in chunk],
            [replies_before[i] for i in chunk],
            [replies_after[i] for i in chunk],
            k,
            base_cache,
            serving,
        )
        for index, result in zip(chunk, batch, strict=True):
            results[index] = result
    return results


def generation_budget(tokenizer: PreTrainedTokenizerBase, original: dict | None) -> int:
    """Tokens to generate for an item: room for an answer as long as the original and then
    some (a check on how an answer ends needs its end), within [MIN, MAX]_EVAL_TOKENS."""
    if not original:
        return MIN_EVAL_TOKENS
    length = len(tokenizer(message_text(original), add_special_tokens=False)["input_ids"])
    return max(MIN_EVAL_TOKENS, min(MAX_EVAL_TOKENS, int(length * 1.5) + 16))


def evaluate_adapter(
    model: PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    feedback_items: Sequence[dict[str, Any]],
    regression_items: Sequence[dict[str, Any]],
    base_cache: dict | None = None,
    replier: Replier | None = None,
    serving: str | None = None,
) -> dict[str, Any]:
    """The gate's report: serving side against candidate on the trained feedback, the held-out
    feedback and the regression prompts, and on each lesson apart.

    Feedback items carry `held_out`, `tags`, `lesson` (the feedback's text) and
    `learned_by_serving` (the serving adapter trained on that lesson); both kinds may carry ids
    (`feedback_id`, `target_id`, `trace_id`) and a `prompt`/`source`, kept in the stored rows
    with the replies, checks and status (contexts are not stored). `base_cache`, `replier`,
    `serving`: see `compare_replies`.
    """
    base_cache = {} if base_cache is None else base_cache
    replier = replier or InProcessReplier(tokenizer.eos_token_id)
    inputs = [*feedback_items, *regression_items]
    results = compare_replies(
        model, tokenizer, inputs, base_cache=base_cache, replier=replier, serving=serving
    )
    kept_keys = ("feedback_id", "target_id", "trace_id", "source", "prompt", "lesson")
    rows = [
        {**{key: item[key] for key in kept_keys if key in item}, **result}
        for item, result in zip(inputs, results, strict=True)
    ]
    feedback_rows, regression_rows = rows[: len(feedback_items)], rows[len(feedback_items) :]
    pairs = list(zip(feedback_rows, feedback_items, strict=True))
    trained = [(row, item) for row, item in pairs if not item.get("held_out")]
    held_out_rows = [row for row, item in pairs if item.get("held_out")]
    drifts = [row["drift"] for row in regression_rows if "drift" in row]
    facts = _facts_against_base(
        model,
        tokenizer,
        regression_items,
        regression_rows,
        base_cache=base_cache,
        replier=replier,
        serving=serving,
    )
    report: dict[str, Any] = {
        "feedback_items": summarize([row for row, _ in trained]),
        "items": [row for row, _ in trained],
        "per_tag": _per_tag(trained),
        "regression": {
            "summary": summarize(regression_rows),
            "mean_drift": round(sum(drifts) / len(drifts), 4) if drifts else None,
            "items": regression_rows,
            **({"facts": facts} if facts else {}),
        },
    }
    if held_out_rows:
        report["held_out"] = {"summary": summarize(held_out_rows), "items": held_out_rows}
    report["per_lesson"] = per_lesson(pairs)
    report["newly_garbled"] = newly_garbled(rows)
    return report


def _facts_against_base(
    model: PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    *,
    base_cache: dict,
    replier: Replier,
    serving: str | None,
) -> dict[str, Any] | None:
    """The general facts (`source` "general") against the base, not against what serves: how
    many the base answers right and which of those the candidate answers wrong, whichever
    version lost them first. Losses against what serves alone could add up version by version
    with nothing bounding the sum. Marks each general row `right_by_base`. None for no facts."""
    general = [index for index, item in enumerate(items) if item.get("source") == "general"]
    if not general:
        return None
    if serving is None:  # the before side is the base already
        right = [rows[index]["before"]["passed"] for index in general]
    else:
        facts = [items[index] for index in general]
        budgets = [generation_budget(tokenizer, fact.get("original")) for fact in facts]
        prompts = [render_prompt(tokenizer, fact["context"], fact.get("tools")) for fact in facts]
        key = ("base replies", tuple(map(tuple, prompts)), tuple(budgets))
        if key not in base_cache:  # the base's replies are the same for every candidate
            base_cache[key] = replier.greedy_replies(model, prompts, budgets, adapter_on=False)
        right = [
            checked_reply(tokenizer, fact, reply)["passed"]
            for fact, reply in zip(facts, base_cache[key], strict=True)
        ]
    lost = []
    for index, right_by_base in zip(general, right, strict=True):
        rows[index]["right_by_base"] = right_by_base
        if right_by_base and not rows[index]["after"]["passed"]:
            lost.append(rows[index].get("prompt") or "")
    return {"asked": len(general), "right_by_base": sum(right), "lost_from_base": lost}


def per_lesson(pairs: Sequence[tuple[dict, dict]]) -> list[dict[str, Any]]:
    """One row per lesson (feedback grouped by its text, compared without case or spacing), in
    the order first seen: its trained and held-out counts and adherence before and after."""
    lessons: dict[str, dict[str, Any]] = {}
    for row, item in pairs:
        text = " ".join((item.get("lesson") or "").split())
        lesson = lessons.setdefault(
            feedback_kind(text),
            {
                "lesson": text,
                "checks": item.get("checks") or [],
                "learned_by_serving": False,
                "trained": dict.fromkeys(STATUSES, 0),
                "held_out": dict.fromkeys(STATUSES, 0),
            },
        )
        lesson["learned_by_serving"] |= bool(item.get("learned_by_serving"))
        lesson["held_out" if item.get("held_out") else "trained"][row["status"]] += 1
    for lesson in lessons.values():
        for section in ("trained", "held_out"):
            rates = adherence(lesson[section])
            lesson[f"{section}_adherence"] = (
                {"before": round(rates[0], 4), "after": round(rates[1], 4)} if rates else None
            )
    return list(lessons.values())


def _per_tag(pairs: Sequence[tuple[dict, dict]]) -> dict[str, dict[str, int]]:
    per_tag: dict[str, dict[str, int]] = {}
    for row, item in pairs:
        for tag_name in item.get("tags") or ():
            counts = per_tag.setdefault(tag_name, dict.fromkeys(STATUSES, 0))
            counts[row["status"]] += 1
    return per_tag


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many items ended in each status."""
    counts = Counter(result["status"] for result in results)
    return {name: counts[name] for name in STATUSES}


def checked_reply(
    tokenizer: PreTrainedTokenizerBase, item: dict[str, Any], reply: list[int]
) -> dict[str, Any]:
    """A greedy reply's text, the item's checks on it and whether it passed them all."""
    text = tokenizer.decode(reply, skip_special_tokens=True).strip()
    message = assistant_message_from_text(text)
    results = run_checks(message, item.get("checks") or [], context=item["context"])
    return {
        "reply": text,
        "checks": [vars(result) for result in results],
        "passed": all(result.passed for result in results),
        "garbled": reply_looks_garbled(message),
    }


def newly_garbled(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose reply looks garbled under the candidate (a phrase going round, a count in
    place of an answer: training/readability.py) where what serves wrote one that reads."""
    return [
        {
            "prompt": row.get("prompt") or f"feedback {row.get('feedback_id', '?')}",
            "before": row["before"]["reply"],
            "after": row["after"]["reply"],
        }
        for row in rows
        if row["after"].get("garbled") and not row["before"].get("garbled")
    ]


def _compare_batch(
    model: PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[dict[str, Any]],
    prompts: list[list[int]],
    replies_before: list[list[int]],
    replies_after: list[list[int]],
    k: int,
    base_cache: dict,
    serving: str | None,
) -> list[dict[str, Any]]:
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    results = []
    for item, before, after in zip(items, replies_before, replies_after, strict=True):
        sides = {}
        for side, reply in (("before", before), ("after", after)):
            sides[side] = checked_reply(tokenizer, item, reply)
        results.append(
            {**sides, "status": status(sides["before"]["passed"], sides["after"]["passed"])}
        )

    teacher_rows = [i for i, item in enumerate(items) if item.get("teacher_context")]
    if teacher_rows:
        teacher_prompts = [
            render_prompt(tokenizer, items[i]["teacher_context"], items[i].get("tools"))
            for i in teacher_rows
        ]
        student_prompts = [prompts[i] for i in teacher_rows]

        def measure(replies: list[list[int]], student: str | None) -> list[float]:
            return _student_teacher_divergence(
                model,
                student_prompts,
                teacher_prompts,
                [replies[i] for i in teacher_rows],
                student=student,
                pad_token_id=pad,
                k=k,
            )

        # The serving side against the teacher is the same for every candidate.
        before_divergence = (
            "divergence",
            tuple(map(tuple, student_prompts)),
            tuple(tuple(replies_before[i]) for i in teacher_rows),
            tuple(map(tuple, teacher_prompts)),
        )
        if before_divergence not in base_cache:
            base_cache[before_divergence] = measure(replies_before, student=serving)
        for side, values in (
            ("before", base_cache[before_divergence]),
            ("after", measure(replies_after, student=CANDIDATE_ADAPTER)),
        ):
            for i, value in zip(teacher_rows, values, strict=True):
                results[i][f"divergence_{side}"] = value

    reference_rows = [i for i, item in enumerate(items) if item.get("reference")]
    if reference_rows:
        pairs = []
        for i in reference_rows:
            input_ids, loss_mask = build_example(
                tokenizer, items[i]["context"], items[i]["reference"], items[i].get("tools")
            )
            pairs.append((input_ids[: loss_mask.index(1)], input_ids[loss_mask.index(1) :]))
        values = _student_teacher_divergence(
            model,
            [prompt for prompt, _ in pairs],
            [prompt for prompt, _ in pairs],
            [reply for _, reply in pairs],
            student=CANDIDATE_ADAPTER,
            pad_token_id=pad,
            k=k,
        )
        for i, value in zip(reference_rows, values, strict=True):
            results[i]["drift"] = value
    return results


def _student_teacher_divergence(
    model: PeftModel,
    student_prompts: list[list[int]],
    teacher_prompts: list[list[int]],
    replies: list[list[int]],
    *,
    student: str | None,
    pad_token_id: int,
    k: int,
) -> list[float]:
    """Teacher = the base (adapters disabled); student = the model under the adapter named
    `student` (None: the base)."""
    with torch.no_grad():
        with adapter_disabled(model):
            teacher_logits, mask = reply_logits(model, teacher_prompts, replies, pad_token_id)
        with weights_of(model, student):
            student_logits, _ = reply_logits(model, student_prompts, replies, pad_token_id)
    return divergence(student_logits, teacher_logits, mask, k)
