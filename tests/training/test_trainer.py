import dataclasses

import pytest
import torch

from training.chat import render_prompt
from training.config import TrainingConfig
from training.evaluation import divergence
from training.losses import topk_tail_reference
from training.sampling import adapter_disabled, generate_replies, reply_logits, weights_of
from training.trainer import (
    DistillItem,
    Example,
    _passes,
    _Tokens,
    add_lora,
    length_bucketed_batches,
    load_adapter_weights,
    train,
)

QUESTIONS = [
    "what is the capital of france ?",
    "what is the capital of italy ?",
    "what color is the sky ?",
    "say hello",
    "say one two three",
    "what is red ?",
]
FEEDBACK = "always begin with answer :"


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _examples() -> list[Example]:
    return [
        Example(
            context=_user(question), reply={"role": "assistant", "content": f"answer : {question}"}
        )
        for question in QUESTIONS
    ]


def _items() -> list[DistillItem]:
    return [
        DistillItem(
            student_context=_user(question),
            teacher_context=_user(f"{question} reviewer feedback : {FEEDBACK}"),
        )
        for question in QUESTIONS[:4]
    ]


def _sft_config(**overrides) -> TrainingConfig:
    # min_steps=1: these tests pin the step count by epochs and batch size.
    defaults = dict(
        lora_r=4,
        lora_alpha=8,
        learning_rate=1e-2,
        epochs=2,
        min_steps=1,
        per_device_batch_size=2,
        save_every_steps=0,
    )
    return TrainingConfig(**{**defaults, **overrides})


def _distill_config(**overrides) -> TrainingConfig:
    defaults = dict(
        mode="distill",
        lora_r=4,
        lora_alpha=8,
        learning_rate=1e-2,
        epochs=2,
        min_steps=1,
        per_device_batch_size=2,
        save_every_steps=0,
        sample_max_tokens=6,
        base_kl_weight=0.0,
    )
    return TrainingConfig(**{**defaults, **overrides})


def _lora_weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


def _base_weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol=0.0):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


@pytest.fixture
def tokenizer(make_tiny_tokenizer):
    return make_tiny_tokenizer()


@pytest.fixture
def make_student(make_tiny_llama):
    """A fresh tiny Llama (always the same weights) under a fresh, seeded LoRA adapter."""
    return lambda config: add_lora(make_tiny_llama(seed=0), config)


def test_batches_hold_neighbours_in_length_order_and_cover_every_index_once():
    lengths = [5, 1, 9, 3, 7, 2, 8]

    batches = length_bucketed_batches(lengths, batch_size=2, seed=0)

    assert sorted(index for batch in batches for index in batch) == list(range(7))
    by_length = sorted(range(7), key=lambda index: lengths[index])
    assert sorted(batches) == sorted(
        [by_length[0:2], by_length[2:4], by_length[4:6], by_length[6:]]
    )


def test_batch_order_is_repeatable_for_a_seed_and_shuffled_across_seeds():
    lengths = list(range(40))

    orders = [length_bucketed_batches(lengths, 2, seed) for seed in (0, 0, 1)]

    assert orders[0] == orders[1]
    assert orders[0] != orders[2]


def test_sft_lowers_the_loss_on_its_examples(make_student, tokenizer):
    config = _sft_config(epochs=8)

    result = train(make_student(config), tokenizer, config, examples=_examples())

    assert result.steps == 8 * 3
    assert result.loss_curve[-1] < result.loss_curve[0] / 2
    assert result.tokens > 0


def test_accumulating_two_batches_of_one_equals_one_batch_of_two(make_student, tokenizer):
    # Two examples of different lengths: a mean of per-batch means would weigh them differently.
    examples = [_examples()[0], Example(_user("say hello"), {"role": "assistant", "content": "hi"})]
    big_batch = _sft_config(epochs=3, per_device_batch_size=2, gradient_accumulation_steps=1)
    accumulated = dataclasses.replace(
        big_batch, per_device_batch_size=1, gradient_accumulation_steps=2
    )
    model_a, model_b = make_student(big_batch), make_student(accumulated)

    result_a = train(model_a, tokenizer, big_batch, examples=examples)
    result_b = train(model_b, tokenizer, accumulated, examples=examples)

    assert result_a.steps == result_b.steps == 3
    assert result_a.loss_curve == pytest.approx(result_b.loss_curve, rel=1e-5)
    _assert_same_weights(_lora_weights(model_a), _lora_weights(model_b), atol=1e-6)


def _tokens(prompt: int, reply: int, rejected: int | None = None) -> _Tokens:
    return _Tokens([1] * prompt, [2] * reply, rejected=None if rejected is None else [3] * rejected)


def test_a_micro_batch_is_split_into_passes_within_the_token_budget_in_order():
    batch = [_tokens(4, 2), _tokens(5, 1), _tokens(3, 3), _tokens(20, 5), _tokens(2, 2)]

    parts = _passes(batch, max_tokens=16)

    assert [seq for part in parts for seq in part] == batch  # every record once, in order
    # rows x longest row within 16, except a record over the budget alone in its pass
    assert [len(part) for part in parts] == [2, 1, 1, 1]
    assert _passes([], max_tokens=16) == []


def test_a_pair_counts_both_replies_and_both_rows():
    pairs = [_tokens(4, 2, rejected=6), _tokens(4, 2, rejected=1)]

    assert len(_passes(pairs, max_tokens=40, rows_per_seq=2)) == 1  # 2 pairs x 2 rows x 10
    assert len(_passes(pairs, max_tokens=39, rows_per_seq=2)) == 2


@pytest.mark.parametrize(
    "make_config",
    [
        lambda **extra: _sft_config(base_kl_weight=2.0, preference_weight=1.0, **extra),
        lambda **extra: _distill_config(base_kl_weight=2.0, **extra),
    ],
    ids=["sft with guard and preference", "distill with guard"],
)
def test_passes_of_one_sequence_give_the_update_of_one_pass_over_the_batch(
    make_config, make_student, tokenizer
):
    one_pass = make_config(epochs=2, per_device_batch_size=3)
    split = dataclasses.replace(one_pass, max_tokens_per_pass=1)
    rows = {"one pass": [], "split": []}  # rows of each forward pass that trains
    results = {}
    for name, config in (("one pass", one_pass), ("split", split)):
        model = make_student(config)

        def count_rows(module, args, kwargs, name=name):
            if torch.is_grad_enabled():
                rows[name].append(kwargs["input_ids"].shape[0])

        hook = model.register_forward_pre_hook(count_rows, with_kwargs=True)
        examples = _examples_with_replaced_answers() if config.mode == "sft" else []
        items = _items()[:3] if config.mode == "distill" else []
        replay = [Example(_user(q), {"role": "assistant", "content": "yes"}) for q in QUESTIONS]
        results[name] = (
            train(model, tokenizer, config, examples=examples, items=items, replay=replay),
            _lora_weights(model),
        )
        hook.remove()

    # One record a pass when split (a preference pair runs its two replies as two rows).
    assert max(rows["split"]) <= 2 < max(rows["one pass"])
    (result_a, weights_a), (result_b, weights_b) = results["one pass"], results["split"]
    assert result_a.loss_curve == pytest.approx(result_b.loss_curve, rel=1e-5)
    _assert_same_weights(weights_a, weights_b, atol=1e-6)


@pytest.mark.parametrize("make_config", [_sft_config, _distill_config], ids=["sft", "distill"])
def test_resuming_from_a_checkpoint_ends_with_the_weights_of_an_uninterrupted_run(
    make_config, make_student, tokenizer, tmp_path
):
    config = make_config(epochs=2, save_every_steps=2)
    data = {"examples": _examples()} if config.mode == "sft" else {"items": _items()}
    uninterrupted = make_student(config)
    train(uninterrupted, tokenizer, config, checkpoint_dir=tmp_path / "a", **data)

    polls = iter([False, False, True])
    interrupted = train(
        make_student(config),
        tokenizer,
        config,
        should_stop=lambda: next(polls),
        checkpoint_dir=tmp_path / "b",
        **data,
    )
    resumed = make_student(config)
    result = train(
        resumed,
        tokenizer,
        config,
        checkpoint_dir=tmp_path / "b",
        resume_from=interrupted.checkpoints[-1],
        **data,
    )

    assert interrupted.steps == 2
    assert interrupted.checkpoints == [tmp_path / "b" / "step-000002"]
    assert result.steps == (4 if config.mode == "distill" else 6)
    _assert_same_weights(_lora_weights(uninterrupted), _lora_weights(resumed))


def test_resuming_with_a_different_config_is_refused(make_student, tokenizer, tmp_path):
    config = _sft_config(save_every_steps=1)
    first = train(
        make_student(config), tokenizer, config, examples=_examples(), checkpoint_dir=tmp_path
    )
    other = dataclasses.replace(config, learning_rate=1e-3)

    with pytest.raises(ValueError, match="different training config"):
        train(
            make_student(other),
            tokenizer,
            other,
            examples=_examples(),
            checkpoint_dir=tmp_path,
            resume_from=first.checkpoints[0],
        )


def test_should_stop_ends_the_run_before_the_next_step(make_student, tokenizer):
    config = _sft_config()
    model = make_student(config)
    before = _lora_weights(model)

    result = train(model, tokenizer, config, examples=_examples(), should_stop=lambda: True)

    assert result.stopped
    assert result.steps == 0
    _assert_same_weights(before, _lora_weights(model))


def test_progress_is_reported_after_every_step(make_student, tokenizer):
    config = _sft_config(epochs=2)
    calls = []

    result = train(
        make_student(config),
        tokenizer,
        config,
        examples=_examples(),
        on_progress=lambda *args: calls.append(args),
    )

    assert [call[:2] for call in calls] == [(step, 6) for step in range(1, 7)]
    assert [call[2] for call in calls] == result.loss_curve
    assert all(tokens_per_s > 0 for *_, tokens_per_s, _ in calls)
    assert calls[-1][4] == 0.0


def test_sequences_longer_than_max_seq_len_are_left_out(make_student, tokenizer):
    config = _sft_config(max_seq_len=40)
    long_example = Example(_user(" ".join(["hello"] * 40)), {"role": "assistant", "content": "hi"})

    result = train(make_student(config), tokenizer, config, examples=[*_examples(), long_example])

    assert result.skipped == 1


def _mean_teacher_divergence(model, tokenizer, items, replies):
    student_prompts = [render_prompt(tokenizer, item.student_context) for item in items]
    teacher_prompts = [render_prompt(tokenizer, item.teacher_context) for item in items]
    with torch.no_grad():
        student_logits, mask = reply_logits(model, student_prompts, replies, pad_token_id=0)
        with adapter_disabled(model):
            teacher_logits, _ = reply_logits(model, teacher_prompts, replies, pad_token_id=0)
    values = divergence(student_logits, teacher_logits, mask, k=20)
    return sum(values) / len(values)


def test_distill_moves_the_student_towards_the_feedback_conditioned_teacher(
    make_student, tokenizer
):
    config = _distill_config(epochs=6)
    model = make_student(config)
    items = _items()
    # Fixed replies to compare on: the teacher's own greedy answers under the hint.
    with adapter_disabled(model):
        replies = generate_replies(
            model,
            [render_prompt(tokenizer, item.teacher_context) for item in items],
            eos_token_id=tokenizer.eos_token_id,
            max_new_tokens=6,
            temperature=None,
        )
    before = _mean_teacher_divergence(model, tokenizer, items, replies)

    train(model, tokenizer, config, items=items)

    # Measured: 0.41 -> 0.23 (15 epochs: 0.15).
    assert _mean_teacher_divergence(model, tokenizer, items, replies) < 0.7 * before


def test_distill_never_changes_the_teacher(make_student, tokenizer):
    config = _distill_config(base_kl_weight=0.5)
    model = make_student(config)
    base_before, lora_before = _base_weights(model), _lora_weights(model)

    train(model, tokenizer, config, items=_items(), replay=_examples()[4:])

    _assert_same_weights(base_before, _base_weights(model))
    assert any(
        not torch.equal(lora_before[name], weight) for name, weight in _lora_weights(model).items()
    )


def test_the_forgetting_guard_keeps_regression_replies_closer_to_the_base(make_student, tokenizer):
    regression = [
        Example(_user(question), {"role": "assistant", "content": "yes"}) for question in QUESTIONS
    ]
    drifts = []
    for weight in (0.0, 5.0):
        config = _sft_config(epochs=6, base_kl_weight=weight)
        model = make_student(config)
        train(model, tokenizer, config, examples=_examples()[:2], replay=regression)
        drifts.append(_regression_drift(model, tokenizer, regression))

    assert drifts[1] < drifts[0]


def test_the_guard_s_reference_is_kept_per_replay_batch_and_trains_as_recomputed(
    make_student, tokenizer, monkeypatch
):
    """The base is frozen and the replay replies fixed, so the guard's reference is computed
    the first time a replay batch comes round and kept: fewer base passes, the same run as one
    that recomputes it at every visit."""
    import training.trainer as trainer

    replay = [
        Example(_user(question), {"role": "assistant", "content": "yes"}) for question in QUESTIONS
    ]
    config = _sft_config(epochs=6, base_kl_weight=1.0)
    real_reference, real_kl = trainer._guard_reference, trainer._base_kl
    references, visits = [], []

    def counting_references(*args, **kwargs):
        references.append(args[1])
        return real_reference(*args, **kwargs)

    def counting_visits(*args, **kwargs):
        visits.append(args[1])
        return real_kl(*args, **kwargs)

    def recomputing(*args, reference=None, **kwargs):
        return counting_visits(*args, **kwargs)  # the kept reference ignored: computed again

    monkeypatch.setattr(trainer, "_guard_reference", counting_references)
    monkeypatch.setattr(trainer, "_base_kl", counting_visits)
    kept = train(make_student(config), tokenizer, config, examples=_examples()[:2], replay=replay)
    kept_references, kept_visits = len(references), len(visits)
    references.clear()
    monkeypatch.setattr(trainer, "_base_kl", recomputing)
    recomputed = train(
        make_student(config), tokenizer, config, examples=_examples()[:2], replay=replay
    )

    # The 6 replay examples make 3 batches of 2, each visited more than once; the second run
    # computed its reference at every visit too.
    assert kept_references == 3 < kept_visits
    assert len(references) == kept_references + kept_visits
    assert kept.loss_curve == pytest.approx(recomputed.loss_curve, rel=1e-5)


def test_given_a_loaded_adapter_the_guard_holds_the_student_to_it_not_to_the_base(
    make_student, tokenizer, tmp_path
):
    """A retrain that starts from a serving adapter (taught "answer : ...") and learns
    something else: guarded by that adapter, its replies on the replay set (the serving
    adapter's lesson) stay nearer the serving adapter's than guarded by the base, which pulls
    them back to before the lesson."""
    config = _sft_config(epochs=6)
    serving = make_student(config)
    train(serving, tokenizer, config, examples=_examples())
    serving.save_pretrained(tmp_path / "serving")
    replay = _examples()[2:]
    new = [Example(_user(q), {"role": "assistant", "content": "yes"}) for q in QUESTIONS[:2]]
    guarded = _sft_config(epochs=6, base_kl_weight=5.0, save_every_steps=2)
    drifts = {}
    for guard_adapter in (None, "serving"):
        student = make_student(guarded)
        student.load_adapter(str(tmp_path / "serving"), adapter_name="serving")
        load_adapter_weights(student, tmp_path / "serving")  # starts where serving is
        checkpoints = tmp_path / f"checkpoints-{guard_adapter}"
        train(
            student,
            tokenizer,
            guarded,
            examples=new,
            replay=replay,
            checkpoint_dir=checkpoints,
            guard_adapter=guard_adapter,
        )
        assert student.active_adapter == "default"
        drifts[guard_adapter] = _regression_drift(student, tokenizer, replay, against="serving")
        # A checkpoint holds the trained adapter alone, not the guard's.
        saved = list(checkpoints.glob("step-*"))
        assert saved and all(not (path / "serving").exists() for path in saved)

    assert drifts["serving"] < 0.5 * drifts[None]


def _regression_drift(model, tokenizer, regression, against: str | None = None):
    """Mean KL of the model's replies from the base's (or the loaded adapter `against`'s)."""
    from training.trainer import _example_tokens

    pairs = [_example_tokens(tokenizer, example) for example in regression]
    prompts, replies = [p.prompt for p in pairs], [p.reply for p in pairs]
    with torch.no_grad():
        student_logits, mask = reply_logits(model, prompts, replies, pad_token_id=0)
        with weights_of(model, against):
            reference_logits, _ = reply_logits(model, prompts, replies, pad_token_id=0)
    values = divergence(student_logits, reference_logits, mask, k=20)
    return sum(values) / len(values)


def test_sft_without_examples_is_refused(make_student, tokenizer):
    config = _sft_config()

    with pytest.raises(ValueError, match="sft trains on examples"):
        train(make_student(config), tokenizer, config, items=_items())


def test_the_sft_loss_over_the_reply_window_equals_the_loss_over_full_logits(make_student):
    """Logits are computed only where reply tokens are predicted; the loss must not change."""
    from training.losses import masked_token_nll
    from training.sampling import pad_right
    from training.trainer import _sft_loss, _Tokens

    student = make_student(_sft_config())
    batch = [
        _Tokens(prompt=[5, 6, 7, 8, 9, 10, 11], reply=[12, 13, 2]),
        _Tokens(prompt=[5, 6, 7], reply=[14, 15, 16, 17, 2]),
        _Tokens(prompt=[5, 6, 7, 8, 9], reply=[18, 2]),
    ]
    input_ids, attention_mask = pad_right(
        [seq.prompt + seq.reply for seq in batch], 0, student.device
    )
    loss_mask = torch.zeros_like(attention_mask)
    for row, seq in enumerate(batch):
        loss_mask[row, len(seq.prompt) : seq.length] = 1
    full_logits = student(input_ids=input_ids, attention_mask=attention_mask).logits
    expected = masked_token_nll(full_logits, input_ids, loss_mask)
    assert _sft_loss(student, batch, pad_token_id=0).item() == pytest.approx(expected.item(), 1e-5)


def test_only_the_newest_checkpoints_stay_on_disk(make_student, tokenizer, tmp_path):
    config = _sft_config(save_every_steps=1)
    result = train(
        make_student(config), tokenizer, config, examples=_examples(), checkpoint_dir=tmp_path
    )

    on_disk = sorted(path.name for path in tmp_path.glob("step-*"))
    assert result.steps > 2
    assert (
        on_disk
        == [path.name for path in result.checkpoints]
        == [
            f"step-{result.steps - 1:06d}",
            f"step-{result.steps:06d}",
        ]
    )


# --- the preference term (sft) -------------------------------------------------------------------


def _examples_with_replaced_answers() -> list[Example]:
    """Each approved reply beside the answer it replaced: the same words with one inserted, as
    a 'never say X' lesson's corrections are (the word removed, the rest kept)."""
    return [
        dataclasses.replace(
            example,
            rejected={"role": "assistant", "content": f"answer : very {question}"},
        )
        for example, question in zip(_examples(), QUESTIONS, strict=True)
    ]


def _preference_margin(model, tokenizer, examples) -> float:
    """Mean log p(approved reply) - log p(replaced reply) under the adapter."""
    from training.trainer import _example_tokens, _reply_logprobs

    pairs = [_example_tokens(tokenizer, example, with_rejected=True) for example in examples]
    prompts = [pair.prompt for pair in pairs]
    with torch.no_grad():
        chosen = _reply_logprobs(model, prompts, [pair.reply for pair in pairs], pad_token_id=0)
        rejected = _reply_logprobs(model, prompts, [pair.rejected for pair in pairs], 0)
    return (chosen - rejected).mean().item()


def test_the_preference_term_widens_the_margin_over_the_replaced_answers(make_student, tokenizer):
    examples = _examples_with_replaced_answers()
    margins = []
    for weight in (0.0, 1.0):
        config = _sft_config(epochs=2, preference_weight=weight, preference_beta=0.5)
        model = make_student(config)
        before = _preference_margin(model, tokenizer, examples)
        train(model, tokenizer, config, examples=examples)
        margins.append(_preference_margin(model, tokenizer, examples) - before)

    # Measured: the margin grew by 2.2 nats with sft alone, by 6.9 with the term on.
    assert margins[1] > margins[0] + 1.0


def test_without_replaced_answers_the_preference_term_changes_nothing(make_student, tokenizer):
    off, on = _sft_config(), _sft_config(preference_weight=1.0)
    model_off, model_on = make_student(off), make_student(on)

    result_off = train(model_off, tokenizer, off, examples=_examples())
    result_on = train(model_on, tokenizer, on, examples=_examples())

    assert result_on.loss_curve == result_off.loss_curve
    _assert_same_weights(_lora_weights(model_off), _lora_weights(model_on))


def test_at_weight_zero_the_preference_pairs_change_nothing(make_student, tokenizer):
    config = _sft_config(preference_weight=0.0)
    with_pairs = make_student(config)
    without_pairs = make_student(config)

    train(with_pairs, tokenizer, config, examples=_examples_with_replaced_answers())
    train(without_pairs, tokenizer, config, examples=_examples())

    _assert_same_weights(_lora_weights(with_pairs), _lora_weights(without_pairs))


def test_accumulation_gives_the_same_update_with_the_preference_term(make_student, tokenizer):
    # One pair and one plain example: the term averages over the step's pairs, not micro-batches.
    examples = [
        _examples_with_replaced_answers()[0],
        Example(_user("say hello"), {"role": "assistant", "content": "hi"}),
    ]
    big_batch = _sft_config(epochs=3, per_device_batch_size=2, preference_weight=2.0)
    accumulated = dataclasses.replace(
        big_batch, per_device_batch_size=1, gradient_accumulation_steps=2
    )
    model_a, model_b = make_student(big_batch), make_student(accumulated)

    result_a = train(model_a, tokenizer, big_batch, examples=examples)
    result_b = train(model_b, tokenizer, accumulated, examples=examples)

    assert result_a.loss_curve == pytest.approx(result_b.loss_curve, rel=1e-5)
    _assert_same_weights(_lora_weights(model_a), _lora_weights(model_b), atol=1e-6)


def test_a_replaced_answer_too_long_to_fit_is_dropped_and_its_example_still_trains(tokenizer):
    from training.trainer import _example_tokens, _rejected_within

    example = dataclasses.replace(
        _examples()[0], rejected={"role": "assistant", "content": " ".join(["very"] * 40)}
    )
    tokens = _example_tokens(tokenizer, example, with_rejected=True)

    kept = _rejected_within(tokens, max_seq_len=tokens.length + 5)

    assert tokens.rejected is not None
    assert kept.rejected is None
    assert (kept.prompt, kept.reply) == (tokens.prompt, tokens.reply)


def test_a_replaced_answer_that_renders_the_same_is_no_pair(tokenizer):
    from training.trainer import _example_tokens

    example = _examples()[0]
    same = dataclasses.replace(example, rejected={**example.reply, "name": "ignored"})

    assert _example_tokens(tokenizer, same, with_rejected=True).rejected is None


def test_the_guard_pulls_towards_the_teacher_where_a_replay_example_has_its_context(
    make_student, tokenizer
):
    """A fresh adapter is the base: under the student's own context the guard has nothing to
    pull, under the teacher's (the lesson shown) it has."""
    from training.trainer import _base_kl, _example_tokens

    student = make_student(_sft_config())
    plain = Example(_user(QUESTIONS[0]), {"role": "assistant", "content": "answer : paris"})
    taught = dataclasses.replace(
        plain, teacher_context=_user(f"{QUESTIONS[0]} reviewer feedback : {FEEDBACK}")
    )

    def guard(example: Example) -> float:
        with torch.no_grad():
            return _base_kl(student, [_example_tokens(tokenizer, example)], 0, k=20).item()

    assert guard(plain) == pytest.approx(0.0, abs=1e-6)
    assert guard(taught) > 1e-3


def _the_bases_own_reply(student, tokenizer) -> tuple[list[int], list[int], list[int]]:
    """A question's prompt, the prompt with the lesson shown, and the base's greedy reply."""
    prompt = render_prompt(tokenizer, _user(QUESTIONS[0]))
    teacher_prompt = render_prompt(
        tokenizer, _user(f"{QUESTIONS[0]} reviewer feedback : {FEEDBACK}")
    )
    with torch.no_grad(), adapter_disabled(student):
        (own,) = generate_replies(
            student,
            [prompt],
            eos_token_id=tokenizer.eos_token_id,
            max_new_tokens=8,
            temperature=None,
        )
    return prompt, teacher_prompt, own


def test_the_guard_takes_the_teacher_only_where_the_lesson_changes_the_base_s_token(
    make_student, tokenizer
):
    """guard_reference "lesson_changes": on a reply the base writes itself token by token,
    the base is the reference everywhere (nothing to pull for a fresh adapter, whatever the
    teacher saw); on a reply it would not write, the teacher is, where the tokens differ."""
    from training.trainer import _base_kl

    student = make_student(_sft_config())
    prompt, teacher_prompt, own = _the_bases_own_reply(student, tokenizer)
    other = tokenizer.encode(" answer : paris", add_special_tokens=False)

    def guard(reply: list[int], **where) -> float:
        tokens = _Tokens(prompt=prompt, reply=reply, teacher_prompt=teacher_prompt)
        with torch.no_grad():
            return _base_kl(student, [tokens], 0, k=20, **where).item()

    assert guard(own) > 1e-3  # the teacher everywhere: the lesson pulls
    assert guard(own, teacher_where_it_differs=True) == pytest.approx(0.0, abs=1e-6)
    assert guard(other, teacher_where_it_differs=True) > 1e-3


def test_at_tokens_an_edit_kept_from_the_bases_answer_the_guard_holds_the_base_s_own_there(
    make_student, tokenizer
):
    """guard_reference "aligned_edits": a replay reply is the base's own answer with words put
    in front ("answer :"). At the inserted words the reference is the teacher (the lesson
    shown); at every token kept from the base's answer it is the base at that token of its
    own answer, not the base reading the inserted words first."""
    from training.trainer import _guard_reference

    student = make_student(_sft_config())
    prompt, teacher_prompt, own = _the_bases_own_reply(student, tokenizer)
    with torch.no_grad(), adapter_disabled(student):
        inserted = tokenizer.encode("answer :", add_special_tokens=False)
        edited = inserted + own
        taught, _ = reply_logits(student, [teacher_prompt], [edited], 0)
        bases_own, _ = reply_logits(student, [prompt], [own], 0)
        expected = torch.cat([taught[:, : len(inserted)], bases_own], dim=1)
    plain = _Tokens(prompt=prompt, reply=edited, teacher_prompt=teacher_prompt)
    anchored = dataclasses.replace(plain, anchor=own)

    top_ids, log_buckets = _guard_reference(student, [anchored], 0, k=20)
    wanted_ids, wanted_buckets = topk_tail_reference(expected, k=20)
    assert torch.equal(top_ids, wanted_ids)
    assert torch.allclose(log_buckets, wanted_buckets, atol=1e-5)
    # Without the anchor the kept tokens' reference is the teacher's, which differs.
    unanchored_ids, _ = _guard_reference(student, [plain], 0, k=20)
    assert not torch.equal(unanchored_ids[:, len(inserted) :], wanted_ids[:, len(inserted) :])
