"""One training job from start to end: load the base model, train (resuming from the newest
checkpoint an earlier attempt left), let the evaluation gate choose among the candidates, write
the chosen adapter. Plain data in (TrainingJob), a plain outcome out (TrainingOutcome); the
caller hears of phases and progress, and is asked whether to stop, through JobCallbacks.

No Django: reviewapp/learning/retrain.py builds the job from a run, moves the run's status in
`on_phase`, and records what comes back.
"""

import itertools
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Called through the module: tests wrap trainer.add_lora and trainer.train to act mid-phase.
from training import trainer
from training.adapters import AdapterInfo, write_adapter
from training.base_models import resolve_base_model
from training.candidates import choose_candidate
from training.checks import passes_every_check
from training.config import GuardReference, TrainingConfig
from training.eval_sets import REPLAY_PROMPTS, feedback_kind, general_regression_items
from training.evaluation import SERVING_ADAPTER, evaluate_adapter
from training.gate import GateThresholds
from training.replay import base_replay_examples, base_tool_replay_examples, lesson_replay_examples
from training.repliers import ModelServers, choose_replier
from training.targets import LessonHint

# One greedy reply of up to MAX_EVAL_TOKENS on a busy CPU server, all items in flight at once.
EVALUATION_TIMEOUT_S = 300.0

Phase = Literal["training", "evaluating"]


@dataclass(frozen=True)
class ServingAdapter:
    """The adapter that serves the project now: the evaluation's "before" side."""

    name: str
    version: int
    path: Path  # its directory (adapter_config.json, adapter_model.safetensors)


@dataclass(frozen=True)
class TrainingJob:
    """Everything a job reads; nothing else (no database, no settings) is consulted."""

    config: TrainingConfig
    base_model: str  # a bundled model's name or a Hugging Face model directory
    model_cache_dir: Path  # bundled models converted once, the base's replay answers cached
    checkpoint_dir: Path  # checkpoints go here, and a job finding some there resumes
    adapter_root: Path  # the chosen adapter is written to `adapter_root/<adapter_name()>`
    thresholds: GateThresholds
    examples: Sequence[trainer.Example] = ()  # sft
    items: Sequence[trainer.DistillItem] = ()  # distill
    # The forgetting guard trains on these first, then on the base's answers to the general
    # replay prompts, `config.replay_examples` in all.
    replay: Sequence[trainer.Example] = ()
    # The lessons the run teaches, as the teacher is shown them: with config.guard_reference
    # other than "base" (with "both", for half of them) the teacher shown them answers the
    # general replay prompts, not the base alone.
    lessons: Sequence[LessonHint] = ()
    # training.evaluation's feedback items (trained and `held_out`); the evaluation adds the
    # general regression facts to `regression_items`.
    feedback_items: Sequence[dict[str, Any]] = ()
    regression_items: Sequence[dict[str, Any]] = ()
    # The adapter's lineage.json: the targets it learned from, and more (the run's id, say).
    target_ids: Sequence[int] = ()
    lineage: dict[str, Any] = field(default_factory=dict)
    # Where the evaluation's greedy replies may come from; None: this process answers them.
    evaluation_servers: ModelServers | None = None
    # What the candidate must be no worse than; None: the base serves.
    serving_adapter: ServingAdapter | None = None


@dataclass(frozen=True)
class Progress:
    step: int  # optimizer steps done, resumed ones included
    total_steps: int
    loss: float
    tokens_per_s: float
    eta_s: float
    # Every step's loss so far, resumed steps included: the job's own list, copy it to keep it.
    loss_curve: Sequence[float]


class JobCallbacks(Protocol):
    def on_phase(self, phase: Phase) -> None:
        """The job starts training (the model is loaded) or evaluating (training is done).
        What this raises ends the job there and reaches run_job's caller."""
        ...

    def on_progress(self, progress: Progress) -> None:
        """After every optimizer step."""
        ...

    def should_stop(self) -> bool:
        """Asked before every training step, before each candidate's evaluation and before
        the adapter is written; True ends the job there, stopped, with nothing written."""
        ...

    def adapter_name(self) -> str:
        """The name the chosen adapter is written under; asked once, just before writing."""
        ...


@dataclass(frozen=True)
class TrainingOutcome:
    stopped: bool  # should_stop() ended the job: no candidate chosen, no adapter written
    loss_curve: list[float]  # one loss per optimizer step, resumed steps included
    # The chosen candidate's row: its step and the gate's decision on it (`passed`, `reason`).
    chosen: dict[str, Any] | None = None
    # The chosen candidate's evaluation report, every candidate tried, where the replies came
    # from, and what training did.
    metrics: dict[str, Any] = field(default_factory=dict)
    adapter: AdapterInfo | None = None


def _offers_tools(job: TrainingJob) -> bool:
    """Whether any turn the job trains was served with tools."""
    return any(example.tools for example in job.examples) or any(item.tools for item in job.items)


class _Stopped(Exception):
    """should_stop() said so between two candidates' evaluations."""


def _general_replay(
    base: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lessons: list[LessonHint],
    reference: GuardReference,
    cache_dir: Path,
) -> list[trainer.Example]:
    """The general prompts the guard replays, answered as `reference` says (the base alone
    where there are no lessons)."""
    if not lessons:
        return base_replay_examples(base, tokenizer, cache_dir=cache_dir)
    if reference in ("lessons", "lesson_changes", "lesson_edits", "aligned_edits"):
        edits = {"lesson_edits": "next_token", "aligned_edits": "answer"}.get(reference)
        return lesson_replay_examples(
            base, tokenizer, lessons, cache_dir=cache_dir, base_edits=edits
        )
    # "both": alternating, so that any first replay_examples of them hold both kinds.
    by_base = base_replay_examples(
        base, tokenizer, prompts=REPLAY_PROMPTS[0::2], cache_dir=cache_dir
    )
    by_teacher = lesson_replay_examples(
        base, tokenizer, lessons, prompts=REPLAY_PROMPTS[1::2], cache_dir=cache_dir
    )
    pairs = itertools.zip_longest(by_base, by_teacher)
    return [example for pair in pairs for example in pair if example is not None]


def run_job(job: TrainingJob, callbacks: JobCallbacks) -> TrainingOutcome:
    """Train, evaluate and write one adapter as `job` says, reporting through `callbacks`."""
    config = job.config
    model_dir = resolve_base_model(job.base_model, job.model_cache_dir)
    base, tokenizer = trainer.load_base_model(model_dir, config)
    cache_dir = job.model_cache_dir / "replay"
    lessons = list(job.lessons) if config.guard_reference != "base" else []
    general = _general_replay(base, tokenizer, lessons, config.guard_reference, cache_dir)
    # A run on turns that offer tools also holds the turn after a tool result, which its
    # targets (a call, an answer after a failure) never show: trained on calculator calls
    # alone, an adapter looped on <tool_response> tags after the result in 4 of 8 episodes.
    tool_turns = (
        base_tool_replay_examples(base, tokenizer, cache_dir=cache_dir)
        if _offers_tools(job)
        else []
    )[: max(0, config.replay_examples - len(job.replay))]
    replay = [*job.replay, *tool_turns, *general][: config.replay_examples]
    model = trainer.add_lora(base, config)
    started_from = _start(model, config, job.serving_adapter)
    serving_name = job.serving_adapter.name if job.serving_adapter else None

    callbacks.on_phase("training")
    resume_from = _latest_checkpoint(job.checkpoint_dir)
    # The curve continues the one a dead worker's checkpoint holds.
    loss_curve = trainer.checkpoint_loss_curve(resume_from) if resume_from else []

    def on_progress(step: int, total: int, loss: float, tokens_per_s: float, eta_s: float):
        loss_curve.append(loss)
        callbacks.on_progress(Progress(step, total, loss, tokens_per_s, eta_s, loss_curve))

    examples = preference_pairs_kept(job.examples, job.feedback_items, config)
    new_lessons = lessons_to_learn(job.feedback_items, from_serving=started_from == serving_name)
    serving = job.serving_adapter
    if serving is not None:  # beside the candidate, frozen, until the candidate is written:
        model.load_adapter(str(serving.path), adapter_name=SERVING_ADAPTER)  # the before side
    # ...and, where the config says so, the guard's reference: the weights the run started
    # from, which the candidate's own leave from the first update on.
    holds_to_serving = config.guard_keeps == "serving" and started_from == serving_name
    guard_adapter = SERVING_ADAPTER if holds_to_serving else None
    result = trainer.train(
        model,
        tokenizer,
        config,
        examples=examples,
        items=job.items,
        replay=replay,
        on_progress=on_progress,
        should_stop=callbacks.should_stop,
        checkpoint_dir=job.checkpoint_dir if config.save_every_steps else None,
        resume_from=resume_from,
        new_lessons=len(new_lessons),
        guard_adapter=guard_adapter,
    )
    if result.stopped:
        return TrainingOutcome(stopped=True, loss_curve=result.loss_curve)

    callbacks.on_phase("evaluating")
    regression_items = [*general_regression_items(), *job.regression_items]
    serving_side: dict = {}  # the serving side's replies, answered once for every candidate
    with httpx.Client(timeout=EVALUATION_TIMEOUT_S) as client:
        replier, evaluated_on = choose_replier(
            client,
            job.evaluation_servers,
            model_dir=model_dir,
            base_model=job.base_model,
            eos_token_id=tokenizer.eos_token_id,
        )

        def evaluate() -> dict:
            if callbacks.should_stop():
                raise _Stopped
            return evaluate_adapter(
                model,
                tokenizer,
                job.feedback_items,
                regression_items,
                serving_side,
                replier=replier,
                serving=SERVING_ADAPTER if serving else None,
            )

        try:
            report, candidates = choose_candidate(
                model, config, result, evaluate=evaluate, thresholds=job.thresholds
            )
        except _Stopped:
            return TrainingOutcome(stopped=True, loss_curve=result.loss_curve)
        finally:
            if serving is not None:  # not written with the candidate
                model.delete_adapter(SERVING_ADAPTER)
    if callbacks.should_stop():
        return TrainingOutcome(stopped=True, loss_curve=result.loss_curve)

    chosen = next(candidate for candidate in candidates if candidate["chosen"])
    metrics = {
        **report,
        "candidates": candidates,
        "evaluated_on": dict(evaluated_on),
        # What the "before" side of every item was: the adapter serving when the run began.
        "serving": {"name": serving.name, "version": serving.version} if serving else None,
        "train": {
            "steps": result.steps,
            "chosen_step": chosen["step"],
            "tokens": result.tokens,
            "seconds": round(result.seconds, 1),
            "skipped": result.skipped,
            "targets": len(job.examples) + len(job.items),
            # The targets handed to the preference term with their replaced answers (the
            # trainer drops a replaced answer too long for max_seq_len).
            "preference_pairs": sum(example.rejected is not None for example in examples),
            "replay_examples": len(replay),
            "tool_replay_examples": len(tool_turns),
            # The lessons the teacher was shown to answer the general replay prompts (none:
            # the base answered them).
            "replay_lessons": [lesson.feedback for lesson in lessons],
            "started_from": started_from,
            # Whose replies the forgetting guard held the run to (TrainingConfig.guard_keeps).
            "guarded_by": serving_name if guard_adapter else "base",
            # Each gets min_steps updates (TrainingConfig.fewest_steps).
            "new_lessons": sorted(new_lessons),
        },
    }
    shutil.rmtree(job.checkpoint_dir, ignore_errors=True)  # the model holds the chosen one
    adapter = write_adapter(
        model,
        job.adapter_root,
        callbacks.adapter_name(),
        config,
        list(job.target_ids),
        extra=job.lineage,
    )
    return TrainingOutcome(
        stopped=False,
        loss_curve=result.loss_curve,
        chosen=chosen,
        metrics=metrics,
        adapter=adapter,
    )


def lessons_to_learn(feedback_items: Sequence[dict[str, Any]], *, from_serving: bool) -> set[str]:
    """The lessons (feedback kinds) of the trained items the starting weights have not learned:
    every one from the base, those the serving adapter did not train on from its weights."""
    return {
        feedback_kind(item.get("lesson") or "")
        for item in feedback_items
        if not item.get("held_out") and not (from_serving and item.get("learned_by_serving"))
    }


def preference_pairs_kept(
    examples: Sequence[trainer.Example],
    feedback_items: Sequence[dict[str, Any]],
    config: TrainingConfig,
) -> list[trainer.Example]:
    """The sft examples, each keeping its replaced answer (the preference term's pair) only
    where config.preference_lessons says: with "followed", an example of a lesson the model
    mostly follows already, judged on the answers its feedback was written on. With the term
    off (weight 0) no example keeps one."""
    if not config.preference_weight:
        followed: set[str] = set()
    elif config.preference_lessons == "all":
        return list(examples)
    else:
        followed = followed_lessons(feedback_items)
    return [
        example
        if example.rejected is None or example.lesson in followed
        else replace(example, rejected=None)
        for example in examples
    ]


def followed_lessons(feedback_items: Sequence[dict[str, Any]]) -> set[str]:
    """The lessons whose feedback items' original answers pass their checks more often than
    not; items without checks or an original answer say nothing either way."""
    passed_by_lesson: dict[str, list[bool]] = {}
    for item in feedback_items:
        if item.get("lesson") is None or not item.get("checks") or not item.get("original"):
            continue
        passed_by_lesson.setdefault(item["lesson"], []).append(
            passes_every_check(item["checks"], item["original"], context=item["context"])
        )
    return {lesson for lesson, passed in passed_by_lesson.items() if sum(passed) * 2 > len(passed)}


def _start(model: PeftModel, config: TrainingConfig, serving: ServingAdapter | None) -> str:
    """Put the serving adapter's weights into the fresh one when the config starts there and
    the shapes fit (same LoRA rank, scale and modules); returns what the run started from: the
    serving adapter's name, "base", or "base" with why the serving adapter could not be used.
    A resumed run then loads its checkpoint over whichever it is."""
    if config.start_from == "base" or serving is None:
        return "base"
    try:
        saved = json.loads((serving.path / "adapter_config.json").read_text())
        weights = load_file(serving.path / "adapter_model.safetensors")
    except (OSError, ValueError) as error:
        return f"base (the serving adapter {serving.name} could not be read: {error})"
    fresh = get_peft_model_state_dict(model)
    same_shape = (
        saved.get("r") == config.lora_r
        and saved.get("lora_alpha") == config.lora_alpha
        and weights.keys() == fresh.keys()
        and all(weights[name].shape == fresh[name].shape for name in fresh)
    )
    if not same_shape:
        return f"base (the serving adapter {serving.name} has another LoRA shape)"
    trainer.load_adapter_weights(model, weights)
    return serving.name


def _latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint an earlier attempt of this job left behind."""
    if not directory.is_dir():
        return None
    complete = sorted(path for path in directory.glob("step-*") if path.is_dir())
    return complete[-1] if complete else None
