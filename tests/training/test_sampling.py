import torch

from training.sampling import generate_anchored, generate_edits, generate_replies, reply_logits

PROMPTS = [[3, 7, 5, 14, 15, 16], [3, 7, 5, 20], [3, 7, 5, 21, 22, 23, 24, 25]]


def test_batched_greedy_replies_match_one_prompt_at_a_time(make_tiny_llama):
    model = make_tiny_llama()

    batched = generate_replies(model, PROMPTS, eos_token_id=2, max_new_tokens=6, temperature=None)

    one_by_one = [
        generate_replies(model, [prompt], eos_token_id=2, max_new_tokens=6, temperature=None)[0]
        for prompt in PROMPTS
    ]
    assert batched == one_by_one


# The same questions, each shown something before it (the lessons, in the guard's use).
ANCHORS = PROMPTS
SHOWN = [
    [3, 40, 41, 42, 7, 5, 14, 15, 16],
    [3, 43, 7, 5, 20],
    [3, 44, 45, 7, 5, 21, 22, 23, 24, 25],
]


def _greedy(model, prompts):
    return generate_replies(model, prompts, eos_token_id=2, max_new_tokens=8, temperature=None)


def _anchored(model, keep_at_least, max_new_tokens=8):
    return generate_anchored(
        model,
        SHOWN,
        ANCHORS,
        eos_token_id=2,
        max_new_tokens=max_new_tokens,
        keep_at_least=keep_at_least,
    )


def test_anchored_replies_kept_at_any_probability_are_the_anchors_greedy_replies(
    make_tiny_llama,
):
    model = make_tiny_llama()

    assert _anchored(model, keep_at_least=0.0) == _greedy(model, ANCHORS)


def test_anchored_replies_kept_at_no_probability_are_the_prompts_greedy_replies(make_tiny_llama):
    model = make_tiny_llama()

    assert _anchored(model, keep_at_least=1.01) == _greedy(model, SHOWN)


def test_an_anchored_token_is_the_anchors_where_the_prompt_finds_it_likely_enough(
    make_tiny_llama,
):
    model = make_tiny_llama()
    with torch.no_grad():
        shown = [model(input_ids=torch.tensor([p])).logits[0, -1].softmax(-1) for p in SHOWN]
        anchored = [model(input_ids=torch.tensor([p])).logits[0, -1].argmax() for p in ANCHORS]
    likely = [float(probs[token]) for probs, token in zip(shown, anchored, strict=True)]
    # A threshold between the rows' probabilities: some rows keep the anchor's token, some not.
    # Midway, not at a row's own probability: the batched pass computes it a rounding apart.
    lowest, second = sorted(likely)[:2]
    keep_at_least = (lowest + second) / 2
    expected = [
        [int(token) if p >= keep_at_least else int(probs.argmax())]
        for probs, token, p in zip(shown, anchored, likely, strict=True)
    ]

    replies = _anchored(model, keep_at_least, max_new_tokens=1)

    assert replies == expected
    # The row below the threshold writes another token than its anchor would.
    below = likely.index(min(likely))
    assert replies[below] != [int(anchored[below])]


def test_a_reply_stops_after_its_end_token(make_tiny_llama):
    model = make_tiny_llama()
    end_token_wins = torch.zeros(model.config.vocab_size)
    end_token_wins[2] = 100.0
    model.lm_head.register_forward_hook(lambda module, inputs, logits: logits + end_token_wins)

    [reply] = generate_replies(
        model, PROMPTS[:1], eos_token_id=2, max_new_tokens=6, temperature=1.0
    )

    assert reply == [2]


def test_reply_logits_are_the_logits_that_predict_each_reply_token(make_tiny_llama):
    model = make_tiny_llama()
    replies = [[30, 31], [32, 33, 34], [35]]

    logits, mask = reply_logits(model, PROMPTS, replies, pad_token_id=0)

    assert mask.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    for row, (prompt, reply) in enumerate(zip(PROMPTS, replies, strict=True)):
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([prompt + reply])).logits[0]
        expected = alone[len(prompt) - 1 : len(prompt) - 1 + len(reply)]
        torch.testing.assert_close(logits[row, : len(reply)].detach(), expected, atol=1e-5, rtol=0)


def _edits(model, prompts, anchors, keep_at_least, max_new_tokens=8):
    return generate_edits(
        model,
        prompts,
        anchors,
        eos_token_id=2,
        max_new_tokens=max_new_tokens,
        keep_at_least=keep_at_least,
    )


def test_edits_kept_at_any_probability_copy_the_anchor_and_at_none_are_the_prompts_greedy(
    make_tiny_llama,
):
    model = make_tiny_llama()
    anchors = [[30, 31, 32, 2], [33, 2], [34, 35, 36, 37, 38, 2]]

    assert _edits(model, SHOWN, anchors, keep_at_least=0.0) == anchors
    assert _edits(model, SHOWN, anchors, keep_at_least=1.01) == _greedy(model, SHOWN)


def _next_token_probabilities(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1].softmax(-1)


def _a_token_unlikely_first_and_likely_next(model, prompt: list[int]) -> tuple[int, int, float]:
    """(the greedy first token, a token w, a threshold) with w below the threshold as the first
    token and above it as the second, after the greedy first; w is not the greedy second."""
    first = _next_token_probabilities(model, prompt)
    greedy = int(first.argmax())
    second = _next_token_probabilities(model, [*prompt, greedy])
    ratio = second / first
    ratio[[greedy, int(second.argmax()), 2]] = 0  # neither greedy token, nor the end
    token = int(ratio.argmax())
    assert first[token] < second[token]
    threshold = float((first[token] * second[token]).sqrt())
    return greedy, token, threshold


def test_an_edit_puts_its_own_token_in_and_goes_on_from_the_same_anchor_token(make_tiny_llama):
    model = make_tiny_llama()
    prompt = SHOWN[0]
    greedy, token, threshold = _a_token_unlikely_first_and_likely_next(model, prompt)

    # The anchor's first token is too unlikely first: the model writes its own, and the
    # anchor's token, likely enough after it, comes next.
    reply = _edits(model, [prompt], [[token]], keep_at_least=threshold, max_new_tokens=2)

    assert reply == [[greedy, token]]


def test_an_edit_that_writes_the_anchors_next_token_leaves_out_the_one_before(make_tiny_llama):
    model = make_tiny_llama()
    prompt = SHOWN[0]
    greedy, token, threshold = _a_token_unlikely_first_and_likely_next(model, prompt)
    first = _next_token_probabilities(model, prompt)
    left_out = int(first.argmin())
    assert first[left_out] < threshold and left_out not in (greedy, token)

    # The model's own first token is the anchor's second: the first is left out, and the
    # anchor goes on from its third.
    reply = _edits(
        model, [prompt], [[left_out, greedy, token]], keep_at_least=threshold, max_new_tokens=2
    )

    assert reply == [[greedy, token]]


def test_an_edit_that_replaced_a_word_goes_on_with_the_anchors_word_after_it(make_tiny_llama):
    model = make_tiny_llama()
    prompt = SHOWN[0]
    greedy, token, threshold = _a_token_unlikely_first_and_likely_next(model, prompt)
    first = _next_token_probabilities(model, prompt)
    second = _next_token_probabilities(model, [*prompt, greedy])
    replaced = int(torch.maximum(first, second).argmin())
    assert max(first[replaced], second[replaced]) < threshold

    # The model writes its own token in place of the anchor's first, which is no likelier after
    # it; the anchor's second is, and the edit goes on with it (without the realignment it
    # would write the model's own second token: `token` is not its greedy).
    reply = _edits(model, [prompt], [[replaced, token]], keep_at_least=threshold, max_new_tokens=2)

    assert reply == [[greedy, token]]
