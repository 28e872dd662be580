"""One training run's knobs, as one frozen dataclass (validated by pydantic).

The UI, the CLI and the tests all build this same object; it is stored on the run row and
written next to the adapter (`to_json`), so a run can always be read back and repeated. A bad
value raises a ValueError (pydantic's ValidationError) that names the field.

Every number has a lower and an upper bound: generous for any run this product makes, finite so
that a slip (`epochs: 1e11`) is refused where it is written instead of holding a GPU for ever.
"""

import dataclasses
import json
import math
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass

# Bigger effective batches average away the few examples one piece of feedback produces.
MAX_EFFECTIVE_BATCH_SIZE = 32

# LoRA wants a higher rate than full fine-tuning; on a few targets 3e-4 learned a behaviour in
# ~24 updates where 1e-4 learned nothing (bench/learning.py). KL gradients are sharper.
_DEFAULT_LEARNING_RATES = {"sft": 3e-4, "distill": 1e-4}

# "sft": cross-entropy on approved revisions / corrected turns (off-policy targets).
# "distill": per-token KL to the feedback-conditioned teacher on the student's own samples.
TrainingMode = Literal["sft", "distill"]

StartFrom = Literal["base", "serving"]
# Whose answers the forgetting guard keeps the student near (TrainingConfig.guard_keeps).
GuardKeeps = Literal["serving", "base"]

# What the forgetting guard pulls the student towards on its general prompts (training/replay.py).
GuardReference = Literal[
    "lessons", "base", "both", "lesson_changes", "lesson_edits", "aligned_edits"
]
# The lessons whose (target, replaced answer) pairs the preference term trains on.
PreferenceLessons = Literal["followed", "all"]


@dataclass(frozen=True, config=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False))
class TrainingConfig:
    mode: TrainingMode = "sft"
    # LoRA rank; 16 on all linear layers is 4.9 M params on SmolLM2-135M, plenty for a few styles.
    lora_r: int = Field(16, ge=1, le=512)
    # LoRA scale is alpha / r: 2x keeps updates visible without raising the learning rate.
    lora_alpha: int = Field(32, ge=1, le=1024)
    # 0: runs are a few steps on a few examples, too short for dropout's regularisation to pay.
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # "all-linear" (peft's shorthand, excludes lm_head) or explicit module names.
    target_modules: Literal["all-linear"] | Annotated[tuple[str, ...], Field(min_length=1)] = (
        "all-linear"
    )
    # None picks the mode's default (see effective_learning_rate).
    learning_rate: float | None = Field(None, gt=0, le=0.1)
    # Share of the optimizer steps over which the learning rate rises linearly from ~0; after
    # that it decays linearly towards 0 at the last step.
    warmup_ratio: float = Field(0.1, ge=0.0, lt=1.0)
    # AdamW's decoupled weight decay; 0: a few hundred steps on LoRA weights need no shrinkage.
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    # Gradients are clipped to this global norm (0: no clipping); guards against one bad batch.
    max_grad_norm: float = Field(1.0, ge=0.0, le=100.0)
    # Passes over the targets when the set is large; small sets get more (see min_steps).
    epochs: int = Field(3, ge=1, le=100)
    # Training is sized by the data: at least this many optimizer updates for each lesson the
    # weights a run starts from have not learned, however few the targets (4-16 targets at 3
    # epochs would be ~3 updates, which teach nothing). Per lesson: a retrain given "Answer:"
    # and "Hope this helps." at once learned only the first in 24 updates (2 runs of 2) and
    # both in 48 in 2 runs of 4 (bench/README.md, "Two new lessons in one retrain" and "The
    # guard holds a retrain").
    min_steps: int = Field(24, ge=1, le=10_000)
    # The largest number of sequences per forward pass; a small set gets smaller batches (at
    # least 4 per pass over the data) so it is seen in more, distinct updates.
    per_device_batch_size: int = Field(8, ge=1, le=MAX_EFFECTIVE_BATCH_SIZE)
    # Forward passes summed per optimizer step; effective batch = this * the batch size.
    gradient_accumulation_steps: int = Field(1, ge=1, le=MAX_EFFECTIVE_BATCH_SIZE)
    # Longest sequence (context + target) in tokens; bounds activation memory per step.
    max_seq_len: int = Field(2048, ge=1, le=32_768)
    # The most tokens (rows x longest row, padding included) one forward-and-backward pass
    # holds: a micro-batch over it is split into passes whose gradients add up to the same
    # step, so this bounds memory and changes nothing else. Activations cost ~2.5 MB a token
    # in fp32 on the bundled model: agent turns of ~580 tokens, 4 and the guard's 4 in one
    # pass, peaked at 8.5 GB, at 1024 tokens a pass 3.0 GB (bench/train_memory.py). None: 1024
    # on a CPU (about as fast as one pass there), 8192 on CUDA (bigger passes keep a GPU busy).
    max_tokens_per_pass: int | None = Field(None, ge=1, le=1_000_000)
    # Seeds LoRA init, data order and the student's samples, so a run can be repeated.
    seed: int = Field(0, ge=0, lt=2**32)
    # distill and the forgetting guard: KL over the top-k tokens plus one tail bucket.
    top_k: int = Field(20, ge=1, le=1000)
    # How the teacher sees the feedback, for revision targets and distill alike: "hint"
    # (appended to the last user/tool message, without the original answer) or "rewrite"
    # (original answer + feedback, "rewrite it"). "hint" kept facts better (DESIGN.md).
    teacher_prompt: Literal["hint", "rewrite"] = "hint"
    # Whether the teacher's greedy edit of the original answer (its words kept wherever the
    # teacher finds them likely, training.targets.EditRequest) is proposed before its samples:
    # the smallest change the feedback asks for, where samples add openers of their own
    # ("Answer: The answer to this question is that...") that broke 6 facts in
    # bench/lessons.py's run P. In one run (Q) "Answer:" then deployed with every fact kept,
    # and the next lesson was refused: its targets were edits of degenerate answers the
    # serving adapter wrote ("Answer: 1. 1. 2. 3. ..."), which an edit keeps: such proposals
    # now look garbled and "checks pass" approval passes over them, and the gate refuses a
    # candidate that writes them. A second run (R, edits that realign after a replaced word)
    # refused "Answer:" for an item of "under 40 words" and 2 facts, as runs without edits
    # did; S, T ("aligned_edits") and U (the base as teacher) deployed it with every fact
    # kept: 4 runs of 5 with edits, 1 of 4 without. On the development set beside
    # "lesson_edits" it kept fewer facts on 2 kinds of 3 and a third looped (bench/README.md,
    # "The teacher's edits of the answers"): off.
    teacher_edits: bool = False
    # Forgetting guard: weight of KL(base || student) on the replay set (the base's own answers
    # to general prompts, and good traces); 0 turns it off. At 0.5 a lesson about how answers
    # end ("suggest an expert") shortened factual answers and broke 2 of 11 facts; at 2.0 every
    # kind in bench/learning.py was learned with at most 1 broken (measured in sft mode).
    base_kl_weight: float = Field(2.0, ge=0.0, le=100.0)
    # Replay examples the guard cycles through (general prompts first, then good traces).
    replay_examples: int = Field(32, ge=0, le=10_000)
    # On the general prompts, the guard's reference: "lessons", the base shown every lesson the
    # run trains on (their feedback and worked examples, as the teacher is shown them), so the
    # lessons reach questions nobody reviewed; "base", the base as it is, which also pulls the
    # student back from the lessons on every question it did not train on. On the test set
    # "lessons" reached the teacher prompt's held-out adherence but broke 3-4 of 11 facts
    # (bench/README.md, "The guard's reference"): "base" until what keeps the facts is found.
    # "both": every other general prompt each way, the teacher's answers carrying the lessons
    # to questions nobody reviewed and the base's holding the rest; on the development set it
    # kept the facts on one kind of two (bench/README.md, "Both references, alternating").
    # "lesson_changes": the teacher's answers, the teacher as reference at the tokens where the
    # lessons change what the base would write, the base at every other token. On the test set
    # its adapters reached the teacher prompt's held-out adherence, and 4 of 5 still broke 2-4
    # facts (bench/README.md, "The teacher only where the lesson changes the answer").
    # "lesson_edits": as "lesson_changes", but each general answer is the base's own, edited by
    # the teacher where it finds the base's token unlikely (training/replay.py), so the answers
    # keep the base's content and leave it only where the lessons do. On the test set 4 runs of
    # 8 deployed at 0.67-0.88 held out (the default: 0.12-0.67), their held-out answers right
    # less often than the base's (bench/README.md, "The base's answers, edited by the
    # teacher"). On the development set with factual questions held out, it carried 3 lessons
    # to 0.88-1.00 (the default: 0.21-0.92) with as many facts kept, and lost 6 of 16 facts on
    # a fourth ("Factual questions in the development set"); the full-loop test's adapter
    # under it broke 2 facts. With the gate's 22 facts it deploys the same 3 development kinds
    # of 4 as "base", facts kept as often, the lessons at 0.88-0.96 held out (the default:
    # 0.21-0.92): it leads where defaults are chosen. Not the default, for facts: since the
    # guard keeps its reference per replay batch the full-loop test's retrain under it fits
    # (368 s), but the gate refused its adapter for 3 of 22 facts broken, where "base" deploys
    # (bench/README.md, '"lesson_edits" with the gate's 22 facts, and what it costs').
    # "aligned_edits": as "lesson_edits", but the teacher edits the base's finished answer, and
    # at every token kept from it the reference is the base at that token of its own answer:
    # after "Answer:" the base goes on "Poland is a country located in...", in its own answer
    # "The capital of Poland is Warsaw." (2 of the gate's 22 facts lost that way, the base made
    # to begin with "Answer:"), so the guard holds what follows a lesson's words to what the base
    # says without them. In one run of bench/lessons.py it kept no more facts than "base": the
    # "Answer:" lesson's own targets taught "Answer: The answer to this question is that Peru
    # is a country..." (bench/README.md, '"aligned_edits"'; see teacher_edits). On the
    # development set it kept the held-out capitals a list lesson had lost (answers right 0.94,
    # "lesson_edits" 0.62: the base after "- " writes "Sweden is a Scandinavian country...") and
    # was still refused, 4 gate facts and 10 replies garbled; on "ending" it broke 3 facts, where
    # "lesson_edits" broke 1 (bench/README.md, "Targets learned only where they leave the base").
    # Runs whose turns were all served with tools always use "base".
    guard_reference: GuardReference = "base"
    # sft: weight of a DPO term on (target, the answer it replaced) pairs, beside the sft loss
    # and the guard, the reference being the base; 0 turns it off. distill items carry no
    # replaced answer, so a distill run ignores it.
    preference_weight: float = Field(1.0, ge=0.0, le=10.0)
    # Whose pairs it trains on: "followed", only a lesson the model mostly follows already
    # (more than half of its feedback items' answers pass its checks: "never do X"), "all",
    # every lesson's. Measured on the development set (bench/README.md, "The preference
    # term"): on such a lesson it deployed its final adapter on 2 seeds of 2 where sft alone
    # regressed an item on both; on 4 lessons the base never follows it did no better than
    # sft (one held-out answer and one fact worse on one) and trained 1.6x as long.
    preference_lessons: PreferenceLessons = "followed"
    # DPO's beta: the scale of the log-prob margin; higher keeps the adapter nearer the base.
    preference_beta: float = Field(0.1, gt=0.0, le=10.0)
    # distill: longest on-policy sample the student writes per item, in tokens.
    sample_max_tokens: int = Field(64, ge=1, le=4096)
    # distill: temperature of those samples; 1.0 samples the student's own distribution.
    sample_temperature: float = Field(1.0, gt=0.0, le=5.0)
    # None: bf16 on CUDA, float32 elsewhere (CPUs here lack bf16 instructions, fp32 is faster).
    bf16: bool | None = None
    # A checkpoint every N optimizer steps (0: none): a run whose worker dies resumes from the
    # last one, and the gate can choose among them.
    save_every_steps: int = Field(8, ge=0, le=10_000)
    # Adapters the gate may choose among: the final one, then earlier checkpoints (at least
    # save_every_steps before it), tried in that order until one passes; an earlier one has
    # learned less and forgotten less.
    gate_candidates: int = Field(2, ge=1, le=10)
    # Where a retrain starts: "base", a fresh adapter; "serving", the weights of the adapter
    # that serves the project now (when it has this config's LoRA shape), so the lessons it
    # learned are already there and a run's updates go to what is new; targets a later lesson
    # superseded are no longer trained, so what they taught has to stay in the weights.
    # Measured (bench/README.md, "Where a retrain starts"): four lessons one after another,
    # from the base the fourth retrain lost what the third had taught (9 items regressed, the
    # gate refused it); from what serves it begins where the earlier lessons were learned.
    start_from: StartFrom = "serving"
    # Whose answers the forgetting guard keeps the student near on the replay set: "base", the
    # base, which also pulls a retrain back from what earlier versions learned on questions
    # nobody reviewed; "serving", the adapter the run starts from (where it starts from one,
    # see start_from; else the base), so a retrain is held to what serves, earlier lessons
    # included. Four lessons one after another (bench/README.md, "The guard holds a retrain to
    # what serves"): held to what serves (1 run), v3 followed all three lessons at 1.00 and v4
    # was refused (4 facts broken, 1 item of "under 40 words"); held to the base (2 runs), v3
    # was refused both times (3 and 4 facts) and v4, given two new lessons, followed all four
    # at 1.00 once and was refused once. Neither leads yet, so the base stays.
    guard_keeps: GuardKeeps = "base"
    # Share of each kind of feedback (same text, 4 items or more) kept out of training so the
    # gate can see whether the lesson generalises (training/eval_sets.py).
    held_out_fraction: float = Field(0.2, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _effective_batch_fits(self) -> "TrainingConfig":
        if self.effective_batch_size > MAX_EFFECTIVE_BATCH_SIZE:
            raise ValueError(
                f"effective batch size (per_device_batch_size {self.per_device_batch_size} x "
                f"gradient_accumulation_steps {self.gradient_accumulation_steps} = "
                f"{self.effective_batch_size}) must be <= {MAX_EFFECTIVE_BATCH_SIZE}"
            )
        return self

    @property
    def effective_learning_rate(self) -> float:
        """The learning rate the optimizer uses: the explicit one, else the mode's default."""
        if self.learning_rate is not None:
            return self.learning_rate
        return _DEFAULT_LEARNING_RATES[self.mode]

    @property
    def effective_batch_size(self) -> int:
        """Sequences per optimizer step."""
        return self.per_device_batch_size * self.gradient_accumulation_steps

    def fewest_steps(self, new_lessons: int = 1) -> int:
        """The fewest updates for a run whose starting weights have not learned `new_lessons`
        of the lessons it trains on (at least one: a run always has something to learn)."""
        return self.min_steps * max(1, new_lessons)

    def batch_size_for(self, examples: int, new_lessons: int = 1) -> int:
        """Sequences per forward pass for a set of `examples`: the configured size, unless the
        set is so small that `epochs` of it give fewer than the fewest steps; then smaller
        batches (at least 4 a pass), so the few examples are seen in more, distinct updates."""
        if self._steps_per_pass(examples, self.per_device_batch_size) * self.epochs >= (
            self.fewest_steps(new_lessons)
        ):
            return self.per_device_batch_size
        return max(1, min(self.per_device_batch_size, examples // 4))

    def passes_for(self, examples: int, new_lessons: int = 1) -> int:
        """Passes over the data: `epochs`, or more when that gives fewer than the fewest steps."""
        batch_size = self.batch_size_for(examples, new_lessons)
        steps_per_pass = self._steps_per_pass(examples, batch_size)
        return max(self.epochs, math.ceil(self.fewest_steps(new_lessons) / steps_per_pass))

    def _steps_per_pass(self, examples: int, batch_size: int) -> int:
        return math.ceil(math.ceil(examples / batch_size) / self.gradient_accumulation_steps)

    def use_bf16(self, *, cuda_available: bool) -> bool:
        """Whether to train in bf16; the caller says whether a bf16-capable CUDA device is there."""
        return cuda_available if self.bf16 is None else self.bf16

    def tokens_per_pass(self, *, cuda: bool) -> int:
        """The most tokens one pass holds; the caller says whether it trains on CUDA."""
        if self.max_tokens_per_pass is not None:
            return self.max_tokens_per_pass
        return 8192 if cuda else 1024

    def to_json(self) -> str:
        """The config as JSON, as stored on the run row and written next to the adapter."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TrainingConfig":
        """Read back `to_json` output; missing keys take today's defaults, unknown keys fail."""
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("training config JSON must be an object")
        if isinstance(data.get("target_modules"), list):
            data["target_modules"] = tuple(data["target_modules"])
        try:
            return cls(**data)
        except ValidationError as error:
            raise ConfigError(validation_problems(error)) from None


class ConfigError(ValueError):
    """A config refused, field by field. A schema that validates it as one of its sections
    names each field under the section (`training.epochs`, see validation_problems)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__(_one_line(problems))


def validation_problems(error: ValidationError) -> list[tuple[str, str]]:
    """pydantic's errors as (`field.sub`, what is wrong); a ConfigError raised while validating
    a section contributes its own fields, under the section's name."""
    problems = []
    for detail in error.errors():
        # Union members add their type to the path ("target_modules.tuple[str, ...]"): drop them.
        location = ".".join(str(part) for part in detail["loc"] if "[" not in str(part))
        nested = (detail.get("ctx") or {}).get("error")
        if isinstance(nested, ConfigError):
            problems += [
                (".".join(part for part in (location, field) if part), message)
                for field, message in nested.problems
            ]
        else:
            problems.append((location, detail["msg"].removeprefix("Value error, ")))
    return problems


def describe_validation_error(error: ValidationError) -> str:
    """pydantic's errors as one line a person reads: `field.sub: what is wrong; ...`."""
    return _one_line(validation_problems(error))


def _one_line(problems: list[tuple[str, str]]) -> str:
    return "; ".join(f"{field}: {message}" if field else message for field, message in problems)
