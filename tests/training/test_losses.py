import math

import pytest
import torch
import torch.nn.functional as F

from training.losses import (
    dpo_loss,
    masked_token_nll,
    per_token_topk_tail_kl,
    sequence_logprobs,
    topk_tail_kl,
    topk_tail_kl_to,
    topk_tail_reference,
)


def _logits_from_probs(*rows: tuple[float, ...]) -> torch.Tensor:
    """[1, len(rows), V] logits whose softmax is exactly the given probability rows."""
    return torch.tensor([rows], dtype=torch.float32).log()


def _random_logits(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


# masked_token_nll


def test_masked_token_nll_equals_hand_computed_negative_log_probs():
    # Tokens 2 and 3 are targets; logits[t] predicts token t+1.
    labels = torch.tensor([[0, 2, 1, 2]])
    loss_mask = torch.tensor([[0, 0, 1, 1]])
    logits = _logits_from_probs(
        (0.6, 0.2, 0.2),  # predicts token 1 (a prompt token): ignored
        (0.2, 0.5, 0.3),  # predicts token 2 = id 1: p = 0.5
        (0.1, 0.1, 0.8),  # predicts token 3 = id 2: p = 0.8
        (0.3, 0.3, 0.4),  # predicts past the end: ignored
    )
    # (-ln 0.5 - ln 0.8) / 2 = (0.693147 + 0.223144) / 2 = 0.458145
    expected = (-math.log(0.5) - math.log(0.8)) / 2

    loss = masked_token_nll(logits, labels, loss_mask)

    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_masked_token_nll_ignores_prompt_tokens():
    labels = torch.tensor([[3, 1, 4, 1, 5, 2]])
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1]])
    logits = _random_logits(1, 6, 8, seed=0)
    changed = logits.clone()
    changed[:, :2] = _random_logits(1, 2, 8, seed=1)  # these predict prompt tokens 1 and 2
    changed_labels = labels.clone()
    changed_labels[:, :3] = torch.tensor([7, 7, 7])

    assert masked_token_nll(changed, changed_labels, loss_mask) == masked_token_nll(
        logits, labels, loss_mask
    )


def test_masked_token_nll_with_no_targets_is_zero():
    logits = _random_logits(2, 4, 8, seed=0)
    labels = torch.zeros(2, 4, dtype=torch.long)

    assert masked_token_nll(logits, labels, torch.zeros(2, 4)).item() == 0.0


def test_masked_token_nll_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="loss_mask"):
        masked_token_nll(
            _random_logits(1, 4, 8, seed=0), torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 3)
        )


# topk_tail_kl


def test_identical_distributions_have_zero_kl():
    logits = _random_logits(2, 5, 10, seed=0)

    loss = topk_tail_kl(logits, logits.clone(), torch.ones(2, 5), k=3)

    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_kl_on_three_token_vocabulary_matches_hand_value():
    teacher = _logits_from_probs((0.5, 0.3, 0.2))
    student = _logits_from_probs((0.2, 0.5, 0.3))
    # Teacher's top-2 are tokens 0 and 1; the tail bucket holds token 2 (0.2 vs 0.3).
    #   0.5 ln(0.5/0.2) = 0.5 * 0.916291 =  0.458145
    #   0.3 ln(0.3/0.5) = 0.3 * -0.510826 = -0.153248
    #   0.2 ln(0.2/0.3) = 0.2 * -0.405465 = -0.081093   (tail)
    #                                 sum =  0.223805
    expected = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.5) + 0.2 * math.log(0.2 / 0.3)

    loss = topk_tail_kl(student, teacher, torch.ones(1, 1), k=2)

    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_tail_bucket_catches_mass_leaking_out_of_the_top_k():
    # Within the top-2 both are 2:1, so a KL over the renormalised top-k alone would be 0.
    # The student puts 0.4 outside the top-2 where the teacher puts 0.1.
    teacher = _logits_from_probs((0.6, 0.3, 0.05, 0.05))
    student = _logits_from_probs((0.4, 0.2, 0.35, 0.05))
    #   0.6 ln(0.6/0.4) = 0.6 * 0.405465 =  0.243279
    #   0.3 ln(0.3/0.2) = 0.3 * 0.405465 =  0.121640
    #   0.1 ln(0.1/0.4) = 0.1 * -1.386294 = -0.138629   (tail: 0.05+0.05 vs 0.35+0.05)
    #                                 sum =  0.226289
    expected = 0.6 * math.log(0.6 / 0.4) + 0.3 * math.log(0.3 / 0.2) + 0.1 * math.log(0.1 / 0.4)

    loss = topk_tail_kl(student, teacher, torch.ones(1, 1), k=2)

    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_moving_mass_within_the_tail_costs_nothing():
    teacher = _logits_from_probs((0.6, 0.3, 0.05, 0.05))
    student = _logits_from_probs((0.6, 0.3, 0.09, 0.01))

    loss = topk_tail_kl(student, teacher, torch.ones(1, 1), k=2)

    assert loss.item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("k", [10, 15])
def test_k_at_least_vocabulary_equals_full_kl(k):
    student = _random_logits(2, 4, 10, seed=0)
    teacher = _random_logits(2, 4, 10, seed=1)
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 1]])
    full_kl = F.kl_div(
        F.log_softmax(student, dim=-1),
        F.log_softmax(teacher, dim=-1),
        log_target=True,
        reduction="none",
    ).sum(dim=-1)
    expected = full_kl[mask.bool()].mean()

    loss = topk_tail_kl(student, teacher, mask, k=k)

    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)


def test_masked_out_positions_do_not_change_kl():
    student = _random_logits(2, 4, 10, seed=0)
    teacher = _random_logits(2, 4, 10, seed=1)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    changed_student, changed_teacher = student.clone(), teacher.clone()
    changed_student[~mask.bool()] = 100.0 * _random_logits(4, 10, seed=2)
    changed_teacher[~mask.bool()] = 100.0 * _random_logits(4, 10, seed=3)

    assert topk_tail_kl(changed_student, changed_teacher, mask, k=3) == topk_tail_kl(
        student, teacher, mask, k=3
    )


def test_gradient_reaches_the_student_only():
    student = _random_logits(1, 3, 10, seed=0).requires_grad_()
    teacher = _random_logits(1, 3, 10, seed=1).requires_grad_()
    mask = torch.tensor([[1, 0, 1]])

    topk_tail_kl(student, teacher, mask, k=3).backward()

    assert teacher.grad is None
    assert student.grad[0, 0].abs().sum() > 0
    assert torch.equal(student.grad[0, 1], torch.zeros(10))


def test_gradient_is_finite_when_the_tail_is_empty():
    student = _random_logits(1, 2, 5, seed=0).requires_grad_()
    teacher = _random_logits(1, 2, 5, seed=1)

    topk_tail_kl(student, teacher, torch.ones(1, 2), k=5).backward()

    assert torch.isfinite(student.grad).all()


def test_per_token_kl_has_one_value_per_position():
    student = _random_logits(2, 4, 10, seed=0)
    teacher = _random_logits(2, 4, 10, seed=1)
    teacher[0, 2] = student[0, 2]

    per_token = per_token_topk_tail_kl(student, teacher, k=3)

    assert per_token.shape == (2, 4)
    assert per_token[0, 2].item() == pytest.approx(0.0, abs=1e-6)
    assert (per_token[1] > 0).all()


def test_bf16_logits_are_scored_in_float32():
    student = _random_logits(1, 2, 10, seed=0)
    teacher = _random_logits(1, 2, 10, seed=1)

    loss = topk_tail_kl(student.bfloat16(), teacher.bfloat16(), torch.ones(1, 2), k=3)

    assert loss.dtype == torch.float32


def test_k_below_one_is_rejected():
    logits = _random_logits(1, 2, 10, seed=0)

    with pytest.raises(ValueError, match="k must be >= 1"):
        topk_tail_kl(logits, logits, torch.ones(1, 2), k=0)


# sequence_logprobs


def test_sequence_logprobs_sums_the_masked_tokens_log_probs_per_row():
    # Aligned: logits[:, t] scores tokens[:, t]; row 0 counts both tokens, row 1 only its first.
    logits = torch.cat(
        [
            _logits_from_probs((0.5, 0.25, 0.25), (0.1, 0.8, 0.1)),
            _logits_from_probs((0.2, 0.2, 0.6), (1 / 3, 1 / 3, 1 / 3)),
        ]
    )
    tokens = torch.tensor([[0, 1], [2, 0]])
    mask = torch.tensor([[1, 1], [1, 0]])

    logprobs = sequence_logprobs(logits, tokens, mask)

    torch.testing.assert_close(
        logprobs, torch.tensor([math.log(0.5) + math.log(0.8), math.log(0.6)])
    )


def test_sequence_logprobs_of_a_row_with_nothing_masked_is_zero():
    logits = _random_logits(1, 3, 5, seed=0)

    logprobs = sequence_logprobs(logits, torch.tensor([[1, 2, 3]]), torch.zeros(1, 3))

    assert logprobs.tolist() == [0.0]


def test_sequence_logprobs_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="tokens has shape"):
        sequence_logprobs(_random_logits(1, 3, 5, seed=0), torch.zeros(1, 3), torch.ones(1, 2))


# dpo_loss


def _dpo(chosen_gain: float, rejected_gain: float, beta: float = 0.1) -> torch.Tensor:
    """dpo_loss for one pair whose reference log-probs are -10 and -12."""
    reference_chosen, reference_rejected = torch.tensor([-10.0]), torch.tensor([-12.0])
    return dpo_loss(
        reference_chosen + chosen_gain,
        reference_rejected + rejected_gain,
        reference_chosen,
        reference_rejected,
        beta,
    )


def test_dpo_loss_is_log_2_when_the_policy_equals_the_reference():
    assert _dpo(0.0, 0.0).item() == pytest.approx(math.log(2), abs=1e-6)


def test_dpo_loss_matches_the_hand_value():
    # beta * ((pc - rc) - (pr - rr)) = 0.5 * (1 - (-1)) = 1; -log sigmoid(1) = log(1 + e^-1)
    expected = math.log(1 + math.exp(-1))

    assert _dpo(1.0, -1.0, beta=0.5).item() == pytest.approx(expected, abs=1e-6)


def test_dpo_loss_falls_as_the_chosen_margin_grows():
    losses = [_dpo(gain, -gain).item() for gain in (-2.0, 0.0, 2.0, 10.0)]

    assert losses == sorted(losses, reverse=True)
    assert len(set(losses)) == len(losses)


def test_dpo_loss_depends_on_the_gains_over_the_reference_not_the_raw_log_probs():
    # A policy that likes the chosen reply less than the rejected one in absolute terms still
    # wins if it moved towards it more than the reference did.
    policy_chosen, policy_rejected = torch.tensor([-20.0]), torch.tensor([-5.0])
    reference_chosen, reference_rejected = torch.tensor([-21.0]), torch.tensor([-4.0])

    loss = dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, 1.0)

    assert loss.item() == pytest.approx(math.log(1 + math.exp(-2)), abs=1e-6)


def test_dpo_loss_gradient_raises_chosen_lowers_rejected_and_spares_the_reference():
    policy_chosen = torch.tensor([-10.0, -3.0], requires_grad=True)
    policy_rejected = torch.tensor([-12.0, -4.0], requires_grad=True)
    reference_chosen = torch.tensor([-10.0, -3.0], requires_grad=True)
    reference_rejected = torch.tensor([-12.0, -4.0], requires_grad=True)

    dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, 0.1).backward()

    # Gradient descent moves against the gradient: chosen up, rejected down.
    assert (policy_chosen.grad < 0).all()
    assert (policy_rejected.grad > 0).all()
    assert reference_chosen.grad is None and reference_rejected.grad is None


def test_dpo_loss_averages_over_pairs():
    pairs = dpo_loss(
        torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 0.0]), torch.zeros(2), torch.zeros(2), 0.5
    )

    assert pairs.item() == pytest.approx((_dpo(1.0, -1.0, 0.5) + _dpo(0.0, 0.0)).item() / 2)


def test_dpo_loss_rejects_mismatched_shapes_and_a_beta_of_zero():
    with pytest.raises(ValueError, match="reference_rejected"):
        dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), 0.0)


def test_the_kl_against_a_kept_reference_is_the_kl_against_the_teacher_s_logits():
    """The guard keeps a frozen teacher's buckets and reuses them: the loss and the student's
    gradient are the same as from the teacher's logits."""
    torch.manual_seed(0)
    teacher = torch.randn(2, 4, 10)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    student_a = torch.randn(2, 4, 10, requires_grad=True)
    student_b = student_a.detach().clone().requires_grad_(True)

    direct = topk_tail_kl(student_a, teacher, mask, k=3)
    kept = topk_tail_kl_to(student_b, topk_tail_reference(teacher, k=3), mask)
    direct.backward()
    kept.backward()

    assert direct.item() > 0.0
    assert kept.item() == pytest.approx(direct.item(), rel=1e-6)
    assert torch.allclose(student_a.grad, student_b.grad)
