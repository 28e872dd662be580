"""One training run's knobs, as one frozen dataclass.

The UI, the CLI and the tests all build this same object; it is stored on the run row and
written next to the adapter (`to_json`), so a run can always be read back and repeated.
"""

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

# Bigger effective batches average away the few examples one piece of feedback produces.
MAX_EFFECTIVE_BATCH_SIZE = 32

_DEFAULT_LEARNING_RATES = {"sft": 1e-4, "distill": 5e-5}

# Type checks come first so a form or a stored JSON with "3" for 3 fails with a ValueError
# naming the field, not a TypeError from a comparison.
_INT_FIELDS = (
    "lora_r",
    "lora_alpha",
    "epochs",
    "per_device_batch_size",
    "gradient_accumulation_steps",
    "max_seq_len",
    "seed",
    "top_k",
    "save_every_steps",
    "sample_max_tokens",
)
_NUMBER_FIELDS = (
    "lora_dropout",
    "learning_rate",
    "base_kl_weight",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "sample_temperature",
    "held_out_fraction",
)


@dataclass(frozen=True)
class TrainingConfig:
    # "sft": cross-entropy on approved revisions / corrected turns (off-policy targets).
    # "distill": per-token KL to the feedback-conditioned teacher on the student's own samples.
    mode: Literal["sft", "distill"] = "sft"
    # LoRA rank; 16 on all linear layers is 4.9 M params on SmolLM2-135M, plenty for a few styles.
    lora_r: int = 16
    # LoRA scale is alpha / r: 2x keeps updates visible without raising the learning rate.
    lora_alpha: int = 32
    # 0: runs are a few steps on a few examples, too short for dropout's regularisation to pay.
    lora_dropout: float = 0.0
    # "all-linear" (peft's shorthand, excludes lm_head) or explicit module names.
    target_modules: str | tuple[str, ...] = "all-linear"
    # None picks the mode's default (see effective_learning_rate); KL gradients are sharper.
    learning_rate: float | None = None
    # Share of the optimizer steps over which the learning rate rises linearly from ~0; after
    # that it decays linearly towards 0 at the last step.
    warmup_ratio: float = 0.1
    # AdamW's decoupled weight decay; 0: a few hundred steps on LoRA weights need no shrinkage.
    weight_decay: float = 0.0
    # Gradients are clipped to this global norm (0: no clipping); guards against one bad batch.
    max_grad_norm: float = 1.0
    # Passes over the targets; few examples need several passes to move the model.
    epochs: int = 3
    # Sequences per forward pass on one device (a worker trains on one device).
    per_device_batch_size: int = 8
    # Forward passes summed per optimizer step; effective batch = this * per_device_batch_size.
    gradient_accumulation_steps: int = 1
    # Longest sequence (context + target) in tokens; bounds activation memory per step.
    max_seq_len: int = 2048
    # Seeds LoRA init, data order and the student's samples, so a run can be repeated.
    seed: int = 0
    # distill: KL over the teacher's top-k tokens plus one tail bucket (see training/losses.py).
    top_k: int = 20
    # How the teacher sees the feedback: "hint" (appended to the last user/tool message, without
    # the original answer) or "rewrite" (original answer + feedback, "rewrite it"). "hint" kept
    # facts intact better on the bundled model (DESIGN.md).
    teacher_prompt: Literal["hint", "rewrite"] = "hint"
    # Forgetting guard: weight of a KL term pulling the student back to the frozen base model;
    # 0 turns it off.
    base_kl_weight: float = 0.1
    # distill: longest on-policy sample the student writes per item, in tokens.
    sample_max_tokens: int = 64
    # distill: temperature of those samples; 1.0 samples the student's own distribution.
    sample_temperature: float = 1.0
    # None: bf16 on CUDA, float32 elsewhere (CPUs here lack bf16 instructions, fp32 is faster).
    bf16: bool | None = None
    # Write an intermediate adapter every N optimizer steps; 0 saves only the final adapter.
    save_every_steps: int = 0
    # Share of each kind of feedback (same text, 4 items or more) kept out of training so the
    # gate can see whether the lesson generalises (training/eval_sets.py).
    held_out_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            _require(type(value) is int, f"{name} must be an integer, not {value!r}")
        for name in _NUMBER_FIELDS:
            value = getattr(self, name)
            _require(
                (value is None and name == "learning_rate") or _is_number(value),
                f"{name} must be a number, not {value!r}",
            )
        _require(
            self.bf16 is None or isinstance(self.bf16, bool),
            f"bf16 must be true, false or null, not {self.bf16!r}",
        )
        _require(
            self.mode in ("sft", "distill"), f"mode must be 'sft' or 'distill', not {self.mode!r}"
        )
        _require(self.lora_r >= 1, f"lora_r must be >= 1, not {self.lora_r}")
        _require(self.lora_alpha > 0, f"lora_alpha must be > 0, not {self.lora_alpha}")
        _require(
            0.0 <= self.lora_dropout < 1.0,
            f"lora_dropout must be in [0, 1), not {self.lora_dropout}",
        )
        _require(
            self.target_modules == "all-linear"
            or (
                isinstance(self.target_modules, tuple)
                and len(self.target_modules) > 0
                and all(isinstance(name, str) and name for name in self.target_modules)
            ),
            "target_modules must be 'all-linear' or a non-empty tuple of module names, "
            f"not {self.target_modules!r}",
        )
        _require(
            self.learning_rate is None or self.learning_rate > 0,
            f"learning_rate must be > 0 (or None for the mode's default), not {self.learning_rate}",
        )
        _require(
            0.0 <= self.warmup_ratio < 1.0,
            f"warmup_ratio must be in [0, 1), not {self.warmup_ratio}",
        )
        _require(self.weight_decay >= 0, f"weight_decay must be >= 0, not {self.weight_decay}")
        _require(
            self.max_grad_norm >= 0,
            f"max_grad_norm must be >= 0 (0: no clipping), not {self.max_grad_norm}",
        )
        _require(self.epochs >= 1, f"epochs must be >= 1, not {self.epochs}")
        _require(
            self.per_device_batch_size >= 1,
            f"per_device_batch_size must be >= 1, not {self.per_device_batch_size}",
        )
        _require(
            self.gradient_accumulation_steps >= 1,
            f"gradient_accumulation_steps must be >= 1, not {self.gradient_accumulation_steps}",
        )
        _require(
            self.effective_batch_size <= MAX_EFFECTIVE_BATCH_SIZE,
            f"effective batch size (per_device_batch_size {self.per_device_batch_size} x "
            f"gradient_accumulation_steps {self.gradient_accumulation_steps} = "
            f"{self.effective_batch_size}) must be <= {MAX_EFFECTIVE_BATCH_SIZE}",
        )
        _require(self.max_seq_len >= 1, f"max_seq_len must be >= 1, not {self.max_seq_len}")
        _require(self.top_k >= 1, f"top_k must be >= 1, not {self.top_k}")
        _require(
            self.teacher_prompt in ("hint", "rewrite"),
            f"teacher_prompt must be 'hint' or 'rewrite', not {self.teacher_prompt!r}",
        )
        _require(
            self.base_kl_weight >= 0, f"base_kl_weight must be >= 0, not {self.base_kl_weight}"
        )
        _require(
            self.sample_max_tokens >= 1,
            f"sample_max_tokens must be >= 1, not {self.sample_max_tokens}",
        )
        _require(
            self.sample_temperature > 0,
            f"sample_temperature must be > 0, not {self.sample_temperature}",
        )
        _require(
            0.0 <= self.held_out_fraction < 1.0,
            f"held_out_fraction must be in [0, 1), not {self.held_out_fraction}",
        )
        _require(
            self.save_every_steps >= 0,
            f"save_every_steps must be >= 0 (0: final adapter only), not {self.save_every_steps}",
        )

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

    def use_bf16(self, *, cuda_available: bool) -> bool:
        """Whether to train in bf16; the caller says whether a bf16-capable CUDA device is there."""
        return cuda_available if self.bf16 is None else self.bf16

    def to_json(self) -> str:
        """The config as JSON, as stored on the run row and written next to the adapter."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TrainingConfig":
        """Read back `to_json` output; missing keys take today's defaults, unknown keys fail."""
        data: Any = json.loads(text)
        _require(isinstance(data, dict), "training config JSON must be an object")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        _require(not unknown, f"unknown training config keys: {', '.join(unknown)}")
        if isinstance(data.get("target_modules"), list):
            data["target_modules"] = tuple(data["target_modules"])
        return cls(**data)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
