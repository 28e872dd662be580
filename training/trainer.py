"""The LoRA training loop, readable top to bottom (nanoGPT style); every knob is in TrainingConfig.

Two modes share the loop:
- `sft`: cross-entropy on the reply tokens of (context, reply) examples (approved revisions,
  corrected turns).
- `distill`: on-policy token-level self-distillation. For each item the student samples a reply
  y ~ p(. | student context); the frozen teacher (the same weights with the adapter disabled)
  scores y under the teacher context (student context + feedback hint); the loss is the top-k +
  tail KL between the two at every token of y. The teacher never changes during a run.
Both add a forgetting guard: `base_kl_weight` x KL(base || student) on the replies of the
replay examples (the base's own answers to general prompts, good traces), the base side
computed with the adapter disabled (or, with `guard_adapter`, as the adapter the run started
from: TrainingConfig.guard_keeps), under the example's `teacher_context` where it has one
(the teacher's answers to general prompts, training/replay.py), or, with guard_reference
"lesson_changes", there only at the tokens the base would not have written itself; at the tokens
a replay reply copied from the base's own (`Example.anchor`, "aligned_edits"), the base at that
token of its own reply.
sft can add a preference term: `preference_weight` x DPO on the examples that carry the answer
their reply replaced (`Example.rejected`), the reference being the base (adapter disabled).

Every optimizer step's loss is a mean over all the target tokens of that step (the preference
term: over all its pairs), however they are split into micro-batches, so gradient accumulation
gives the same update as one big batch.
"""

import difflib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from training.chat import Message, build_example, render_prompt
from training.config import TrainingConfig
from training.losses import (
    TopkTailReference,
    dpo_loss,
    masked_token_nll,
    sequence_logprobs,
    topk_tail_kl,
    topk_tail_kl_to,
    topk_tail_reference,
)
from training.sampling import (
    adapter_disabled,
    generate_replies,
    pad_right,
    reply_logits,
    weights_of,
)

ProgressCallback = Callable[[int, int, float, float, float], None]

# Checkpoints kept on disk during a run (the newest ones); a long run writes many.
KEPT_CHECKPOINTS = 2
# The guard's references that take the teacher only at the tokens the base would not write.
TEACHER_WHERE_IT_DIFFERS = ("lesson_changes", "lesson_edits")


@dataclass(frozen=True)
class Example:
    """A turn to learn (sft) or to keep (regression): the context the model saw, the reply."""

    context: list[Message]
    reply: Message
    tools: list[dict] | None = None
    # sft: the answer `reply` replaced (the original turn a correction or revision rewrote);
    # the preference term prefers `reply` to it. None: no pair.
    rejected: Message | None = None
    # sft: the feedback's text it teaches (a feedback item's "lesson"): whether its pair is
    # kept is decided per lesson (training.job, config.preference_lessons). None: no lesson.
    lesson: str | None = None
    # replay: the context the guard's base side sees instead of `context` (the teacher's, with
    # the lessons shown); None: the same context as the student.
    teacher_context: list[Message] | None = None
    # replay: the base's own reply to `context` that `reply` edits (config.guard_reference
    # "aligned_edits"); at every reply token copied from it the guard's reference is the base at
    # the same point of this reply, under `context`. None: no anchor.
    anchor: Message | None = None


@dataclass(frozen=True)
class DistillItem:
    """A prompt for on-policy distillation, as the student sees it and as the teacher sees it
    (built with training.targets: `hint_context` by default, see config.teacher_prompt)."""

    student_context: list[Message]
    teacher_context: list[Message]
    tools: list[dict] | None = None


@dataclass(frozen=True)
class TrainingResult:
    loss_curve: list[float]  # one value per optimizer step, resumed steps included
    steps: int  # optimizer steps done, resumed ones included
    tokens: int  # tokens the student trained on (context + reply, padding excluded)
    seconds: float  # wall time of this call
    stopped: bool = False  # should_stop() ended the run early
    # Examples/items longer than max_seq_len, left out rather than cut (cutting the context
    # would train on a prompt the model never saw).
    skipped: int = 0
    checkpoints: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class _Tokens:
    """One training sequence as token ids; distill items also carry the teacher's prompt and
    get their reply from the student's sample; sft examples may carry the replaced reply."""

    prompt: list[int]
    reply: list[int]
    teacher_prompt: list[int] | None = None
    rejected: list[int] | None = None
    anchor: list[int] | None = None  # the reply the guard's replay reply edits (Example.anchor)

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.reply)


def load_base_model(
    model_dir: Path, config: TrainingConfig, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model (bf16 on a bf16-capable GPU unless the config says otherwise) + tokenizer."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if config.use_bf16(cuda_available=cuda_bf16) else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True)
    return model.to(device), tokenizer


def add_lora(model: PreTrainedModel, config: TrainingConfig) -> PeftModel:
    """Wrap the model with a fresh LoRA adapter; its random init is seeded by the config.

    peft injects the adapter into the model's own modules: use the returned model from here on
    (`adapter_disabled` gives the base back).
    """
    torch.manual_seed(config.seed)
    target_modules = config.target_modules
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def length_bucketed_batches(lengths: Sequence[int], batch_size: int, seed: int) -> list[list[int]]:
    """Indices in batches of similar length: sort by length, chunk, shuffle the chunks (seeded).

    Similar lengths waste little compute on padding; shuffling the chunks keeps the steps from
    running short-to-long.
    """
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    generator = torch.Generator().manual_seed(seed)
    return [chunks[index] for index in torch.randperm(len(chunks), generator=generator).tolist()]


def train(
    model: PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    config: TrainingConfig,
    *,
    examples: Sequence[Example] = (),
    items: Sequence[DistillItem] = (),
    replay: Sequence[Example] = (),
    on_progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    checkpoint_dir: Path | None = None,
    resume_from: Path | None = None,
    new_lessons: int = 1,
    guard_adapter: str | None = None,
) -> TrainingResult:
    """Train the model's adapter in place: on `examples` in sft mode, on `items` in distill.

    `new_lessons`: the lessons among them the adapter's starting weights have not learned;
    each gets `min_steps` updates (TrainingConfig.fewest_steps).

    `guard_adapter`: a loaded adapter, not the one trained, whose answers the forgetting guard
    keeps the student near (TrainingConfig.guard_keeps); None: the base.

    `on_progress(step, total_steps, loss, tokens_per_s, eta_s)` is called after every optimizer
    step and `should_stop()` before each one. With `save_every_steps`, a checkpoint (adapter,
    optimizer, step, RNG state) goes to `checkpoint_dir/step-NNNNNN`; passing one of those as
    `resume_from` continues the run as if it had not stopped.
    """
    if config.mode == "sft" and (items or not examples):
        raise ValueError("sft trains on examples (context, reply) and takes no distill items")
    if config.mode == "distill" and (examples or not items):
        raise ValueError("distill trains on items (student and teacher context), not examples")
    if config.save_every_steps and checkpoint_dir is None:
        raise ValueError("save_every_steps needs a checkpoint_dir")
    # Padding is masked out everywhere; any id would do.
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # --- data: token ids, too-long sequences left out, micro-batches bucketed by length -------
    use_preference = config.mode == "sft" and config.preference_weight > 0
    if config.mode == "sft":
        main = [_example_tokens(tokenizer, example, use_preference) for example in examples]
    else:
        main = [_item_tokens(tokenizer, item) for item in items]
    guard = [_example_tokens(tokenizer, example) for example in replay]
    sample_room = config.sample_max_tokens if config.mode == "distill" else 0
    main_kept = [
        _rejected_within(seq, config.max_seq_len)
        for seq in main
        if _longest(seq) + sample_room <= config.max_seq_len
    ]
    guard_kept = [seq for seq in guard if _longest(seq) <= config.max_seq_len]
    skipped = len(main) - len(main_kept) + len(guard) - len(guard_kept)
    main, guard = main_kept, guard_kept
    if not main:
        raise ValueError(f"nothing to train on: all {skipped} sequences exceed max_seq_len")
    use_guard = bool(guard) and config.base_kl_weight > 0

    # Sized by the data: a small set gets small batches and as many passes as min_steps needs.
    batch_size = config.batch_size_for(len(main), new_lessons)
    micro_batches = [
        batch
        # A new chunk order every pass, the same one every time the run is repeated.
        for epoch in range(config.passes_for(len(main), new_lessons))
        for batch in length_bucketed_batches(
            [seq.length for seq in main], batch_size, config.seed + epoch
        )
    ]
    guard_batches = length_bucketed_batches([seq.length for seq in guard], batch_size, config.seed)
    accumulation = config.gradient_accumulation_steps
    total_steps = math.ceil(len(micro_batches) / accumulation)
    warmup_steps = math.ceil(config.warmup_ratio * total_steps)

    # --- optimizer over the adapter weights only ----------------------------------------------
    trainable = [param for param in model.parameters() if param.requires_grad]
    # fused: one kernel for all adapter tensors instead of several per tensor (CPU and CUDA).
    optimizer = torch.optim.AdamW(
        trainable, lr=config.effective_learning_rate, weight_decay=config.weight_decay, fused=True
    )
    start_step, loss_curve, tokens = 0, [], 0
    if resume_from is not None:
        start_step, loss_curve, tokens = _load_checkpoint(resume_from, model, optimizer, config)
    else:
        torch.manual_seed(config.seed)  # the student's samples and LoRA dropout

    # --- the loop -------------------------------------------------------------------------------
    budget = config.tokens_per_pass(cuda=model.device.type == "cuda")
    model.train()
    started = time.monotonic()
    session_tokens = 0
    stopped = False
    checkpoints: list[Path] = []
    # The guard's reference per (replay batch, pass): the base is frozen and the replies fixed,
    # so it is computed the first time a batch comes round and reused after. It was most of a
    # step's time when the reference is the base under the lessons' long context. Kept as top-k
    # buckets: about 250 bytes a reply token, 160 MB for 10,000 replay replies of 64 tokens.
    guard_references: dict[tuple[int | None, int], TopkTailReference] = {}
    for step in range(start_step, total_steps):
        if should_stop is not None and should_stop():
            stopped = True
            break
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, total_steps, warmup_steps, config)

        first_micro = step * accumulation
        batches = [
            [main[index] for index in batch]
            for batch in micro_batches[first_micro : first_micro + accumulation]
        ]
        if config.mode == "distill":
            batches = [_with_student_samples(model, tokenizer, batch, config) for batch in batches]
        guard_ids = [
            (first_micro + micro) % len(guard_batches) if use_guard else None
            for micro in range(len(batches))
        ]
        guard_step = [
            [guard[index] for index in guard_batches[guard_id]] if guard_id is not None else []
            for guard_id in guard_ids
        ]
        main_tokens = sum(_reply_tokens(batch) for batch in batches)
        guard_tokens = sum(_reply_tokens(batch) for batch in guard_step)
        step_pairs = sum(len(_pairs(batch)) for batch in batches)

        # Each pass weighs its share of the step's reply tokens (pairs, for the preference
        # term): every term is a mean over the whole step, so accumulation and the passes a
        # micro-batch is split into change nothing but memory. One backward per pass: only
        # one pass's activations are held at a time.
        step_loss = 0.0
        for batch, guard_id, guard_batch in zip(batches, guard_ids, guard_step, strict=True):
            for part in _passes(batch, budget):
                if config.mode == "sft":
                    loss = _sft_loss(model, part, pad_token_id)
                else:
                    loss = _teacher_kl(model, part, pad_token_id, config.top_k)
                step_loss += _backward(loss * _reply_tokens(part) / main_tokens)
            for part_index, part in enumerate(_passes(guard_batch, budget)):
                key = (guard_id, part_index)
                if key not in guard_references:
                    guard_references[key] = _guard_reference(
                        model,
                        part,
                        pad_token_id,
                        config.top_k,
                        teacher_where_it_differs=config.guard_reference in TEACHER_WHERE_IT_DIFFERS,
                        adapter=guard_adapter,
                    )
                loss = _base_kl(
                    model, part, pad_token_id, config.top_k, reference=guard_references[key]
                )
                share = _reply_tokens(part) / guard_tokens
                step_loss += _backward(config.base_kl_weight * loss * share)
            # Chosen and rejected replies run side by side: two rows a pair (the base's pass
            # for the reference holds no activations).
            for part in _passes(_pairs(batch) if use_preference else [], budget, rows_per_seq=2):
                loss = _preference_loss(model, part, pad_token_id, config.preference_beta)
                step_loss += _backward(config.preference_weight * loss * len(part) / step_pairs)
            batch_tokens = sum(seq.length for seq in [*batch, *guard_batch])
            tokens += batch_tokens
            session_tokens += batch_tokens
        if config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        loss_curve.append(step_loss)
        done = step + 1
        if on_progress is not None:
            elapsed = max(time.monotonic() - started, 1e-9)
            on_progress(
                done,
                total_steps,
                step_loss,
                session_tokens / elapsed,
                elapsed / (done - start_step) * (total_steps - done),
            )
        if config.save_every_steps and done % config.save_every_steps == 0:
            checkpoints.append(
                _save_checkpoint(checkpoint_dir, model, optimizer, config, done, loss_curve, tokens)
            )
            # Resuming needs the newest only; one more in case the newest is being read.
            for old in checkpoints[:-KEPT_CHECKPOINTS]:
                shutil.rmtree(old, ignore_errors=True)
            checkpoints = checkpoints[-KEPT_CHECKPOINTS:]

    model.eval()
    return TrainingResult(
        loss_curve=loss_curve,
        steps=len(loss_curve),
        tokens=tokens,
        seconds=time.monotonic() - started,
        stopped=stopped,
        skipped=skipped,
        checkpoints=checkpoints,
    )


def _learning_rate(step: int, total_steps: int, warmup_steps: int, config: TrainingConfig) -> float:
    """Linear warmup to the peak, then linear decay; the last step still moves (> 0)."""
    peak = config.effective_learning_rate
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * (total_steps - step) / (total_steps - warmup_steps)


# --- losses on micro-batches --------------------------------------------------------------------


def _sft_loss(model: PeftModel, batch: list[_Tokens], pad_token_id: int) -> torch.Tensor:
    """Mean NLL of the reply tokens given their prompts.

    Full-vocabulary logits are computed only over the window of positions that predict reply
    tokens (from the shortest prompt's end to the longest sequence's end): prompts (system,
    tools, earlier turns) are most of an agent's sequence, and their logits would be thrown away.
    """
    input_ids, attention_mask = pad_right(
        [seq.prompt + seq.reply for seq in batch], pad_token_id, model.device
    )
    loss_mask = torch.zeros_like(attention_mask)
    for row, seq in enumerate(batch):
        loss_mask[row, len(seq.prompt) : seq.length] = 1
    first = min(len(seq.prompt) for seq in batch) - 1  # predicts the earliest reply token
    window = torch.arange(first, input_ids.shape[1], device=model.device)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=window, use_cache=False
    ).logits
    return masked_token_nll(logits, input_ids[:, first:], loss_mask[:, first:])


def _teacher_kl(model: PeftModel, batch: list[_Tokens], pad_token_id: int, k: int) -> torch.Tensor:
    """KL(teacher || student) on the student's own reply, teacher = base under the hint context."""
    replies = [seq.reply for seq in batch]
    with torch.no_grad(), adapter_disabled(model):
        teacher_logits, _ = reply_logits(
            model, [seq.teacher_prompt for seq in batch], replies, pad_token_id
        )
    student_logits, mask = reply_logits(model, [seq.prompt for seq in batch], replies, pad_token_id)
    return topk_tail_kl(student_logits, teacher_logits, mask, k)


def _base_kl(
    model: PeftModel,
    batch: list[_Tokens],
    pad_token_id: int,
    k: int,
    *,
    teacher_where_it_differs: bool = False,
    reference: TopkTailReference | None = None,
) -> torch.Tensor:
    """Forgetting guard: KL(base || student) on replay replies, against `reference` (the
    base's side, `_guard_reference`), computed here when not given."""
    if reference is None:
        reference = _guard_reference(
            model, batch, pad_token_id, k, teacher_where_it_differs=teacher_where_it_differs
        )
    prompts, replies = [seq.prompt for seq in batch], [seq.reply for seq in batch]
    student_logits, mask = reply_logits(model, prompts, replies, pad_token_id)
    return topk_tail_kl_to(student_logits, reference, mask)


def _guard_reference(
    model: PeftModel,
    batch: list[_Tokens],
    pad_token_id: int,
    k: int,
    *,
    teacher_where_it_differs: bool = False,
    adapter: str | None = None,
) -> TopkTailReference:
    """The guard's reference on replay replies: the base (or the loaded, frozen `adapter`)
    under the teacher's context where the example has one, else under the student's. The
    reference is frozen and the replies fixed, so a run computes it once per replay batch and
    reuses it each time the guard comes round. Computed in eval mode: LoRA dropout on the
    reference adapter would make it a different reference each time.

    With `teacher_where_it_differs`, the teacher's context is the reference only at the reply
    tokens the reference under the student's own context would not have chosen (where the
    lessons change the answer); everywhere else the reference as it is (config.guard_reference
    "lesson_changes" and "lesson_edits").

    Where an example has an `anchor` (the base's own reply that its reply edits), the reference
    at each reply token copied from the anchor is the reference at that token of the anchor,
    under the student's context: after "Answer:" put in front of "The capital of Poland is
    Warsaw.", the guard holds "The" to what the base writes first, not to what it writes after
    "Answer:" (config.guard_reference "aligned_edits").
    """
    prompts, replies = [seq.prompt for seq in batch], [seq.reply for seq in batch]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), weights_of(model, adapter):
            logits, _ = reply_logits(
                model, [seq.teacher_prompt or seq.prompt for seq in batch], replies, pad_token_id
            )
            if teacher_where_it_differs and any(seq.teacher_prompt for seq in batch):
                bare_logits, _ = reply_logits(model, prompts, replies, pad_token_id)
                reply_ids, _ = pad_right(replies, pad_token_id, model.device)
                agrees = bare_logits.argmax(dim=-1) == reply_ids
                logits = torch.where(agrees[..., None], bare_logits, logits)
            if any(seq.anchor for seq in batch):
                anchors = [seq.anchor or seq.reply for seq in batch]
                anchor_logits, _ = reply_logits(model, prompts, anchors, pad_token_id)
                for row, seq in enumerate(batch):
                    for reply_at, anchor_at in _copied_from(seq.reply, seq.anchor or []):
                        logits[row, reply_at] = anchor_logits[row, anchor_at]
    finally:
        model.train(was_training)
    return topk_tail_reference(logits, k)


def _copied_from(reply: list[int], anchor: list[int]) -> list[tuple[int, int]]:
    """(reply position, anchor position) of every reply token an edit of `anchor` kept: the
    two sequences' longest common blocks, in order (difflib's matching blocks)."""
    matcher = difflib.SequenceMatcher(None, reply, anchor, autojunk=False)
    return [
        (reply_at + offset, anchor_at + offset)
        for reply_at, anchor_at, size in matcher.get_matching_blocks()
        for offset in range(size)
    ]


def _preference_loss(
    model: PeftModel, batch: list[_Tokens], pad_token_id: int, beta: float
) -> torch.Tensor:
    """DPO: the approved reply preferred to the one it replaced, under the same prompt; the
    reference is the base (adapter disabled). A pair costs four more passes over a reply (both
    replies, base and adapter): the sft pass over the approved one is not reused."""
    prompts = [seq.prompt for seq in batch] * 2
    replies = [seq.reply for seq in batch] + [seq.rejected for seq in batch]
    with torch.no_grad(), adapter_disabled(model):
        reference = _reply_logprobs(model, prompts, replies, pad_token_id)
    policy = _reply_logprobs(model, prompts, replies, pad_token_id)
    pairs = len(batch)
    return dpo_loss(policy[:pairs], policy[pairs:], reference[:pairs], reference[pairs:], beta)


def _reply_logprobs(
    model: PeftModel, prompts: list[list[int]], replies: list[list[int]], pad_token_id: int
) -> torch.Tensor:
    """log p(reply | prompt) per row, summed over the reply tokens only ([B])."""
    logits, mask = reply_logits(model, prompts, replies, pad_token_id)
    reply_ids, _ = pad_right(replies, pad_token_id, model.device)
    return sequence_logprobs(logits, reply_ids, mask)


def _with_student_samples(
    model: PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    batch: list[_Tokens],
    config: TrainingConfig,
) -> list[_Tokens]:
    """The items with replies the student (adapter on, current weights) samples right now."""
    replies = generate_replies(
        model,
        [seq.prompt for seq in batch],
        eos_token_id=tokenizer.eos_token_id,
        max_new_tokens=config.sample_max_tokens,
        temperature=config.sample_temperature,
    )
    return [replace(seq, reply=reply) for seq, reply in zip(batch, replies, strict=True)]


def _backward(loss: torch.Tensor) -> float:
    loss.backward()
    return loss.item()


def _passes(batch: list[_Tokens], max_tokens: int, rows_per_seq: int = 1) -> list[list[_Tokens]]:
    """The micro-batch in consecutive parts of at most `max_tokens` (rows x longest row, the
    padded size a pass runs), one record at least; [] for an empty batch."""
    parts: list[list[_Tokens]] = []
    longest = 0  # the longest row of the last part
    for seq in batch:
        length = _longest(seq, with_rejected=rows_per_seq > 1)
        if parts and (len(parts[-1]) + 1) * rows_per_seq * max(longest, length) <= max_tokens:
            parts[-1].append(seq)
            longest = max(longest, length)
        else:
            parts.append([seq])
            longest = length
    return parts


# --- data ----------------------------------------------------------------------------------------


def _example_tokens(
    tokenizer: PreTrainedTokenizerBase, example: Example, with_rejected: bool = False
) -> _Tokens:
    """The example's ids; `with_rejected`: its replaced reply too, rendered in the same context,
    unless it has none or it renders to the same ids (no preference to learn)."""
    prompt, reply = _prompt_and_reply(tokenizer, example.context, example.reply, example.tools)
    rejected = None
    if with_rejected and example.rejected is not None:
        _, rejected = _prompt_and_reply(tokenizer, example.context, example.rejected, example.tools)
        rejected = rejected if rejected != reply else None
    teacher_prompt = None
    if example.teacher_context is not None:
        teacher_prompt, _ = _prompt_and_reply(
            tokenizer, example.teacher_context, example.reply, example.tools
        )
    anchor = None
    if example.anchor is not None:
        _, anchor = _prompt_and_reply(tokenizer, example.context, example.anchor, example.tools)
    return _Tokens(
        prompt=prompt, reply=reply, teacher_prompt=teacher_prompt, rejected=rejected, anchor=anchor
    )


def _prompt_and_reply(
    tokenizer: PreTrainedTokenizerBase,
    context: list[Message],
    reply: Message,
    tools: list[dict] | None,
) -> tuple[list[int], list[int]]:
    input_ids, loss_mask = build_example(tokenizer, context, reply, tools)
    reply_start = loss_mask.index(1)
    return input_ids[:reply_start], input_ids[reply_start:]


def _item_tokens(tokenizer: PreTrainedTokenizerBase, item: DistillItem) -> _Tokens:
    return _Tokens(
        prompt=render_prompt(tokenizer, item.student_context, item.tools),
        reply=[],
        teacher_prompt=render_prompt(tokenizer, item.teacher_context, item.tools),
    )


def _longest(seq: _Tokens, with_rejected: bool = False) -> int:
    """The longest sequence the model runs for this record (the teacher's prompt may be longer;
    `with_rejected`: the replaced reply too)."""
    replies = [seq.reply, seq.rejected or []] if with_rejected else [seq.reply]
    replies.append(seq.anchor or [])
    return max(len(seq.prompt), len(seq.teacher_prompt or [])) + max(map(len, replies))


def _rejected_within(seq: _Tokens, max_seq_len: int) -> _Tokens:
    """The record, without its replaced reply if that one is too long: sft still trains on it."""
    if seq.rejected is not None and len(seq.prompt) + len(seq.rejected) > max_seq_len:
        return replace(seq, rejected=None)
    return seq


def _reply_tokens(batch: list[_Tokens]) -> int:
    return sum(len(seq.reply) for seq in batch)


def _pairs(batch: list[_Tokens]) -> list[_Tokens]:
    """The records that carry a replaced reply: the preference term's pairs."""
    return [seq for seq in batch if seq.rejected is not None]


# --- checkpoints ---------------------------------------------------------------------------------


def _save_checkpoint(
    checkpoint_dir: Path,
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    config: TrainingConfig,
    step: int,
    loss_curve: list[float],
    tokens: int,
) -> Path:
    """Adapter, optimizer, progress and RNG state, written whole or not at all."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / f"step-{step:06d}"
    partial = Path(tempfile.mkdtemp(dir=checkpoint_dir, prefix=f".{final.name}.partial-"))
    try:
        # The trained adapter alone: one loaded beside it (the guard's) is not the run's.
        model.save_pretrained(partial, selected_adapters=[model.active_adapter])
        torch.save(optimizer.state_dict(), partial / "optimizer.pt")
        state = {
            "step": step,
            "loss_curve": loss_curve,
            "tokens": tokens,
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        torch.save(state, partial / "trainer_state.pt")
        (partial / "training_config.json").write_text(config.to_json())
        if final.exists():  # the same step of an earlier attempt of this run
            shutil.rmtree(final)
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def adapter_weights(model: PeftModel) -> dict[str, torch.Tensor]:
    """A copy of the adapter's weights, to put back with `load_adapter_weights`."""
    return {
        name: tensor.detach().clone() for name, tensor in get_peft_model_state_dict(model).items()
    }


def load_adapter_weights(model: PeftModel, weights: dict[str, torch.Tensor] | Path) -> None:
    """Put adapter weights (a copy, or a checkpoint's) into the model in place."""
    if isinstance(weights, Path):
        weights = load_file(weights / "adapter_model.safetensors")
    set_peft_model_state_dict(model, weights)


def checkpoint_step(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step-"))


def checkpoint_loss_curve(checkpoint: Path) -> list[float]:
    """The loss per optimizer step up to a checkpoint: what a resumed run's curve starts with."""
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    return list(state["loss_curve"])


def _load_checkpoint(
    checkpoint: Path, model: PeftModel, optimizer: torch.optim.Optimizer, config: TrainingConfig
) -> tuple[int, list[float], int]:
    """Restore what `_save_checkpoint` wrote; returns (step, loss_curve, tokens)."""
    saved_config = TrainingConfig.from_json((checkpoint / "training_config.json").read_text())
    if saved_config != config:
        raise ValueError(f"{checkpoint} was written by a run with a different training config")
    set_peft_model_state_dict(model, load_file(checkpoint / "adapter_model.safetensors"))
    optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    torch.set_rng_state(state["cpu_rng"])
    if state["cuda_rng"]:
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["step"], list(state["loss_curve"]), state["tokens"]
