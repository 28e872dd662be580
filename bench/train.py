"""Training throughput: our trainer against TRL's SFTTrainer on the same LoRA fine-tune.

Run from the repository root, in the project's virtualenv, with TRL installed
(`pip install "trl>=0.20,<2"`; it is not a project dependency):

    python bench/train.py

Both sides train the bundled SmolLM2-135M-Instruct (converted once into `var/models`) with the
same LoRA adapter (r 16, alpha 32, all linear layers, dropout 0, same seed for its init), on the
same twelve short chats (a user question, an assistant reply starting with "Answer:"), for the
same epochs and batch size, with the same optimizer settings (AdamW, peak learning rate, linear
warmup and decay, gradient clipping), in float32 on CPU (bf16 on a CUDA device, both sides).
Loss on the reply tokens only on both sides: TRL gets the chats as conversational
prompt-completion records, which it trains completion-only.

The runs alternate (ours, TRL, ours, TRL, ...), each on a freshly loaded base model. A run's
clock starts after the model is loaded and covers what each trainer does from there: adding the
adapter, preparing the data, training. Tokens are counted the same way for both: the non-padding
tokens of every batch trained on (prompt + reply). Medians over the runs are reported, with the
CPU seconds of this process next to the wall seconds. Every run stops at the deadline
(`--max-seconds`), runs not started by then are skipped, and a run cut short is left out of the
medians.

On a shared machine, another process using torch at the same time slows both far more than the
load average suggests, CPU seconds included (torch's threads probably spin waiting for each
other). Compare only runs where the load stayed low; the script prints it after every run.
"""

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Everything is on disk already; nothing may be fetched from a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import datasets
import torch
import transformers
import trl
from datasets import Dataset
from peft import LoraConfig
from transformers import PrinterCallback, TrainerCallback
from trl import SFTConfig, SFTTrainer

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/train.py` puts bench/, not the root, first

from training.base_models import resolve_base_model  # noqa: E402
from training.config import TrainingConfig  # noqa: E402
from training.trainer import Example, add_lora, load_base_model, train  # noqa: E402

BASE_MODEL = "SmolLM2-135M-Instruct"
MODEL_CACHE_DIR = REPO_ROOT / "var" / "models"
GOAL_RATIO = 1.5  # from the issue: our tokens/s at least 1.5x TRL's

# Fixed data, so every run of the benchmark trains on exactly the same tokens.
CHATS = (
    ("What is the capital of France?", "Answer: Paris."),
    ("How many legs does a spider have?", "Answer: Eight."),
    ("What gas do plants take in for photosynthesis?", "Answer: Carbon dioxide."),
    ("Which planet is closest to the Sun?", "Answer: Mercury, at about 58 million km."),
    ("What is 12 times 12?", "Answer: 144."),
    ("Who wrote 'Pride and Prejudice'?", "Answer: Jane Austen, in 1813."),
    ("What is the boiling point of water at sea level?", "Answer: 100 degrees Celsius."),
    ("Which ocean is the largest?", "Answer: The Pacific Ocean."),
    ("What does a thermometer measure?", "Answer: Temperature."),
    (
        "Why do we see lightning before we hear thunder?",
        "Answer: Light travels much faster than sound, so the flash arrives first.",
    ),
    ("What is the chemical symbol for gold?", "Answer: Au, from the Latin 'aurum'."),
    (
        "How do I reverse a list in Python?",
        "Answer: Call my_list.reverse() to reverse it in place, or use my_list[::-1] for a copy.",
    ),
)


@dataclass(frozen=True)
class RunSettings:
    """What every run of either trainer gets."""

    model_dir: Path
    config: TrainingConfig
    bf16: bool  # bf16 on a bf16-capable CUDA device; load_base_model makes the same choice
    trl_gradient_checkpointing: bool
    deadline: float  # time.monotonic() at which runs stop


@dataclass(frozen=True)
class RunResult:
    trainer: str  # "ours" or "TRL"
    tokens: int  # non-padding tokens of every batch trained on
    wall_s: float  # adapter + data preparation + training, model loading excluded
    loop_s: float  # the training loop alone, as each trainer reports it
    cpu_s: float  # CPU time of this process (all its threads) over wall_s
    steps: int
    first_loss: float
    final_loss: float
    stopped: bool  # hit the deadline before the last step
    load_average: float  # 1-minute load average at the end of the run

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


class StopAtDeadline(TrainerCallback):
    """TRL's side of `train(should_stop=...)`: no step starts after the deadline."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() >= self.deadline:
            control.should_training_stop = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="(ours, TRL) run pairs, alternating")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per step, both")
    parser.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's own default; off unless given, as our trainer does not recompute activations",
    )
    parser.add_argument("--max-seconds", type=float, default=540.0, help="the whole benchmark")
    args = parser.parse_args()
    if args.pairs < 1 or args.epochs < 1 or args.batch_size < 1:
        parser.error("--pairs, --epochs and --batch-size must be at least 1")

    deadline = time.monotonic() + args.max_seconds
    config = TrainingConfig(
        mode="sft",
        lora_r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules="all-linear",
        epochs=args.epochs,
        per_device_batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        seed=0,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    settings = RunSettings(
        model_dir=resolve_base_model(BASE_MODEL, MODEL_CACHE_DIR),
        config=config,
        bf16=device == "cuda" and torch.cuda.is_bf16_supported(),
        trl_gradient_checkpointing=args.trl_gradient_checkpointing,
        deadline=deadline,
    )
    _quiet_libraries()
    _print_machine(device, settings)

    results: list[RunResult] = []
    skipped = 0
    for _pair in range(args.pairs):
        for run in (_run_ours, _run_trl):
            if time.monotonic() >= deadline:
                skipped += 1
                continue
            result = run(settings)
            results.append(result)
            _print_run(result)
            gc.collect()
    _print_summary(results, skipped)


def _run_ours(settings: RunSettings) -> RunResult:
    config = settings.config
    base, tokenizer = load_base_model(settings.model_dir, config)
    examples = [
        Example(
            context=[{"role": "user", "content": question}],
            reply={"role": "assistant", "content": answer},
        )
        for question, answer in CHATS
    ]
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    model = add_lora(base, config)
    result = train(
        model,
        tokenizer,
        config,
        examples=examples,
        should_stop=lambda: time.monotonic() >= settings.deadline,
    )
    wall_s, cpu_s = time.perf_counter() - wall_started, time.process_time() - cpu_started
    return RunResult(
        trainer="ours",
        tokens=result.tokens,
        wall_s=wall_s,
        loop_s=result.seconds,
        cpu_s=cpu_s,
        steps=result.steps,
        first_loss=result.loss_curve[0],
        final_loss=result.loss_curve[-1],
        stopped=result.stopped,
        load_average=os.getloadavg()[0],
    )


def _run_trl(settings: RunSettings) -> RunResult:
    config = settings.config
    base, tokenizer = load_base_model(settings.model_dir, config)
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": question}],
                "completion": [{"role": "assistant", "content": answer}],
            }
            for question, answer in CHATS
        ]
    )
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.target_modules,
        task_type="CAUSAL_LM",
    )
    with tempfile.TemporaryDirectory(prefix="bench-train-trl-") as output_dir:
        sft_config = SFTConfig(
            output_dir=output_dir,
            num_train_epochs=config.epochs,
            per_device_train_batch_size=config.per_device_batch_size,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            learning_rate=config.effective_learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=config.warmup_ratio,  # below 1: a share of the steps, as ours
            weight_decay=config.weight_decay,
            max_grad_norm=config.max_grad_norm,
            max_length=config.max_seq_len,
            seed=config.seed,
            # TRL's default is bf16 everywhere, which these CPUs would emulate slowly.
            bf16=settings.bf16,
            gradient_checkpointing=settings.trl_gradient_checkpointing,
            completion_only_loss=True,
            include_num_input_tokens_seen="non_padding",
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_pin_memory=torch.cuda.is_available(),
        )
        wall_started, cpu_started = time.perf_counter(), time.process_time()
        torch.manual_seed(config.seed)  # the LoRA init, as add_lora seeds ours
        trainer = SFTTrainer(
            model=base,
            args=sft_config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[StopAtDeadline(settings.deadline)],
        )
        trainer.remove_callback(PrinterCallback)  # the per-step logs; the losses are kept
        output = trainer.train()
        wall_s, cpu_s = time.perf_counter() - wall_started, time.process_time() - cpu_started
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return RunResult(
        trainer="TRL",
        tokens=trainer.state.num_input_tokens_seen,
        wall_s=wall_s,
        loop_s=output.metrics["train_runtime"],
        cpu_s=cpu_s,
        steps=trainer.state.global_step,
        first_loss=losses[0],
        final_loss=losses[-1],
        stopped=trainer.state.global_step < trainer.state.max_steps,
        load_average=os.getloadavg()[0],
    )


def _quiet_libraries() -> None:
    """No progress bars or per-step logs between the figures."""
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def _print_machine(device: str, settings: RunSettings) -> None:
    config = settings.config
    cores = len(os.sched_getaffinity(0))
    print(
        f"machine: {cores} cores usable ({os.cpu_count()} in all), torch {torch.__version__} "
        f"with {torch.get_num_threads()} threads, transformers {transformers.__version__}, "
        f"TRL {trl.__version__}, load average {os.getloadavg()[0]:.1f}"
    )
    if device == "cuda":
        precision = "bf16" if settings.bf16 else "float32 (no bf16 on this GPU)"
        print(f"device: CUDA ({torch.cuda.get_device_name()}), {precision} for both trainers")
    else:
        print("device: CPU, float32 for both trainers")
    checkpointing = "on" if settings.trl_gradient_checkpointing else "off"
    print(
        f"data: {len(CHATS)} chats x {config.epochs} epochs, batch {config.per_device_batch_size}, "
        f"LoRA r {config.lora_r} alpha {config.lora_alpha} on all linear layers, "
        f"peak lr {config.effective_learning_rate}, TRL gradient checkpointing {checkpointing}\n"
    )


def _print_run(result: RunResult) -> None:
    stopped = " (stopped at the deadline)" if result.stopped else ""
    print(
        f"{result.trainer:>4}: {result.tokens} tokens in {result.wall_s:.1f} s "
        f"({result.tokens_per_s:.1f} tokens/s; loop {result.loop_s:.1f} s, "
        f"CPU {result.cpu_s:.1f} s), "
        f"{result.steps} steps, loss {result.first_loss:.3f} -> {result.final_loss:.3f}, "
        f"load {result.load_average:.1f}{stopped}",
        flush=True,
    )


def _print_summary(results: list[RunResult], skipped: int) -> None:
    by_trainer = {
        name: [result for result in results if result.trainer == name and not result.stopped]
        for name in ("ours", "TRL")
    }
    stopped = sum(result.stopped for result in results)
    if skipped or stopped:
        print(
            f"\n{stopped} runs cut short and {skipped} skipped: the deadline (--max-seconds) came "
            "first; only complete runs count below"
        )
    if not all(by_trainer.values()):
        print("not enough runs for a comparison")
        return

    def median(name: str, figure: Callable[[RunResult], float]) -> float:
        return statistics.median(figure(result) for result in by_trainer[name])

    # Other work on a shared machine only ever slows a run down, so the fastest run is the one
    # it disturbed least.
    def fastest(name: str) -> float:
        return max(result.tokens_per_s for result in by_trainer[name])

    print(f"\nmedians ({len(by_trainer['ours'])} runs of ours, {len(by_trainer['TRL'])} of TRL):\n")
    print(
        "| trainer | tokens | wall s | tokens/s | loop s | CPU s | tokens/CPU s | final loss "
        "| tokens/s, fastest run |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in ("ours", "TRL"):
        print(
            f"| {name} | {median(name, lambda r: r.tokens):.0f} "
            f"| {median(name, lambda r: r.wall_s):.1f} "
            f"| {median(name, lambda r: r.tokens_per_s):.1f} "
            f"| {median(name, lambda r: r.loop_s):.1f} "
            f"| {median(name, lambda r: r.cpu_s):.1f} "
            f"| {median(name, lambda r: r.tokens / r.cpu_s):.1f} "
            f"| {median(name, lambda r: r.final_loss):.3f} "
            f"| {fastest(name):.1f} |"
        )
    ratio = median("ours", lambda r: r.tokens_per_s) / median("TRL", lambda r: r.tokens_per_s)
    cpu_ratio = median("ours", lambda r: r.tokens / r.cpu_s) / median(
        "TRL", lambda r: r.tokens / r.cpu_s
    )
    loop_ratio = median("ours", lambda r: r.tokens / r.loop_s) / median(
        "TRL", lambda r: r.tokens / r.loop_s
    )
    verdict = "met" if ratio >= GOAL_RATIO else "not met"
    print(
        f"\nratio ours / TRL, tokens/s: {ratio:.2f} (by CPU: {cpu_ratio:.2f}, training loops "
        f"alone: {loop_ratio:.2f}, fastest runs: {fastest('ours') / fastest('TRL'):.2f}); "
        f"goal >= {GOAL_RATIO}: {verdict}"
    )


if __name__ == "__main__":
    main()
