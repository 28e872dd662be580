"""Training losses as pure functions of tensors (no model code).

Position convention (causal LM): `logits[:, t]` is the model's distribution over token t+1.
- `masked_token_nll` takes the logits and the token ids of the same sequences and does the
  shift itself: `loss_mask[:, t]` marks token t as a target, scored by `logits[:, t - 1]`
  (so token 0 can never be a target).
- The KL functions compare two distributions for the same next token. Student and teacher see
  different contexts, so the caller slices both to the response and passes them aligned:
  `student_logits[:, t]` and `teacher_logits[:, t]` predict the same token, and `mask[:, t]`
  marks which of those positions count. No shift happens there.
- `sequence_logprobs` follows the KL functions' convention (logits aligned with the tokens
  they score), and `dpo_loss` takes its per-sequence sums.
All math runs in float32 whatever the logits' dtype, so bf16 training loses nothing here.
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

# A tail bucket can be empty (k >= vocabulary) or round to 0; its log mass is clamped to this so
# the KL stays finite and, when both tails are empty, the bucket contributes exactly 0.
_LOG_MIN_TAIL_MASS = math.log(1e-12)


def masked_token_nll(
    logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Mean -log p(token) over the target tokens only ([B, T, V], [B, T], [B, T] -> scalar).

    Prompt tokens and padding are excluded by `loss_mask`; a batch with no targets gives 0.
    """
    _require_same_shape(labels, loss_mask, "labels", "loss_mask")
    _require_same_shape(logits[..., 0], labels, "logits[..., 0]", "labels")
    token_nll = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), labels[:, 1:], reduction="none"
    )
    return _masked_mean(token_nll, loss_mask[:, 1:])


class TopkTailReference(NamedTuple):
    """The teacher's side of the top-k + tail KL, computed once: its k most likely token ids at
    each position ([B, T, k]) and its log-probabilities over those k buckets and the tail
    ([B, T, k+1], float32)."""

    top_ids: torch.Tensor
    log_buckets: torch.Tensor


def topk_tail_reference(teacher_logits: torch.Tensor, k: int) -> TopkTailReference:
    """The buckets of `per_token_topk_tail_kl` read off the teacher (detached): a frozen
    teacher's can be kept and reused against the student as it trains."""
    if k < 1:
        raise ValueError(f"k must be >= 1, not {k}")
    k = min(k, teacher_logits.shape[-1])
    teacher_logprobs = F.log_softmax(teacher_logits.detach().float(), dim=-1)
    teacher_top_logprobs, top_ids = teacher_logprobs.topk(k, dim=-1)
    log_buckets = torch.cat(
        [teacher_top_logprobs, _log_tail_mass(teacher_logprobs, top_ids)], dim=-1
    )
    return TopkTailReference(top_ids, log_buckets)


def per_token_topk_tail_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int
) -> torch.Tensor:
    """KL(teacher || student) at every position over top-k + tail buckets ([B, T, V] x2 -> [B, T]).

    The buckets are the teacher's k most likely tokens plus one "tail" holding each
    distribution's remaining mass, so a student that moves mass among unlikely tokens is not
    penalised, but one that puts too much (or too little) mass outside the teacher's top-k is.
    The teacher is detached: gradients reach the student only.
    """
    _require_same_shape(student_logits, teacher_logits, "student_logits", "teacher_logits")
    return per_token_kl_to_reference(student_logits, topk_tail_reference(teacher_logits, k))


def per_token_kl_to_reference(
    student_logits: torch.Tensor, reference: TopkTailReference
) -> torch.Tensor:
    """`per_token_topk_tail_kl` against buckets computed earlier ([B, T, V] -> [B, T])."""
    _require_same_shape(
        student_logits[..., 0],
        reference.top_ids[..., 0],
        "student_logits[..., 0]",
        "top_ids[..., 0]",
    )
    student_logprobs = F.log_softmax(student_logits.float(), dim=-1)
    top_ids = reference.top_ids
    student_buckets = torch.cat(
        [student_logprobs.gather(-1, top_ids), _log_tail_mass(student_logprobs, top_ids)], dim=-1
    )
    teacher_buckets = reference.log_buckets
    return (teacher_buckets.exp() * (teacher_buckets - student_buckets)).sum(dim=-1)


def topk_tail_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, k: int
) -> torch.Tensor:
    """`per_token_topk_tail_kl` averaged over the positions where `mask` is set (scalar)."""
    _require_same_shape(student_logits[..., 0], mask, "student_logits[..., 0]", "mask")
    return _masked_mean(per_token_topk_tail_kl(student_logits, teacher_logits, k), mask)


def topk_tail_kl_to(
    student_logits: torch.Tensor, reference: TopkTailReference, mask: torch.Tensor
) -> torch.Tensor:
    """`topk_tail_kl` against a teacher's buckets computed earlier (scalar)."""
    _require_same_shape(student_logits[..., 0], mask, "student_logits[..., 0]", "mask")
    return _masked_mean(per_token_kl_to_reference(student_logits, reference), mask)


def sequence_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Sum of log p(token) over the positions where `mask` is set ([B, T, V], [B, T] x2 -> [B]).

    Aligned, no shift: `logits[:, t]` is the distribution that scored `tokens[:, t]`. A row
    with nothing masked sums to 0; padded positions may hold any token id.
    """
    _require_same_shape(tokens, mask, "tokens", "mask")
    _require_same_shape(logits[..., 0], tokens, "logits[..., 0]", "tokens")
    token_logprobs = F.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None])[..., 0]
    return (token_logprobs * mask.to(token_logprobs.dtype)).sum(dim=-1)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """DPO (Rafailov et al. 2023) over sequence log-probabilities ([B] x4 -> scalar).

    Mean over pairs of -log sigmoid(beta * ((pc - rc) - (pr - rr))): the policy gains by
    raising the chosen reply's likelihood relative to the reference more than the rejected
    one's. Where the policy equals the reference the loss is log 2. The reference is detached:
    gradients reach the policy only. `beta` scales the margin (higher: a sharper preference,
    the policy kept on a shorter leash from the reference).
    """
    for name, tensor in (
        ("policy_rejected", policy_rejected),
        ("reference_chosen", reference_chosen),
        ("reference_rejected", reference_rejected),
    ):
        _require_same_shape(policy_chosen, tensor, "policy_chosen", name)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, not {beta}")
    chosen_gain = policy_chosen.float() - reference_chosen.detach().float()
    rejected_gain = policy_rejected.float() - reference_rejected.detach().float()
    return -F.logsigmoid(beta * (chosen_gain - rejected_gain)).mean()


def _log_tail_mass(logprobs: torch.Tensor, top_ids: torch.Tensor) -> torch.Tensor:
    """log of the probability outside `top_ids`, shape [..., 1]."""
    # The lowest finite value rather than -inf: logsumexp over an all -inf row has a NaN
    # gradient, which the clamp below would not stop (0 * NaN is NaN).
    outside_top = logprobs.scatter(-1, top_ids, torch.finfo(logprobs.dtype).min)
    return outside_top.logsumexp(dim=-1, keepdim=True).clamp_min(_LOG_MIN_TAIL_MASS)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.to(values.dtype)
    # clamp: a batch with no masked positions yields 0, not NaN.
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


def _require_same_shape(a: torch.Tensor, b: torch.Tensor, a_name: str, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{a_name} has shape {tuple(a.shape)} but {b_name} has {tuple(b.shape)}")
