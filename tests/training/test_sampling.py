import torch

from training.sampling import generate_anchored, generate_replies, reply_logits

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
