import torch

from training.sampling import generate_replies, reply_logits

PROMPTS = [[3, 7, 5, 14, 15, 16], [3, 7, 5, 20], [3, 7, 5, 21, 22, 23, 24, 25]]


def test_batched_greedy_replies_match_one_prompt_at_a_time(make_tiny_llama):
    model = make_tiny_llama()

    batched = generate_replies(model, PROMPTS, eos_token_id=2, max_new_tokens=6, temperature=None)

    one_by_one = [
        generate_replies(model, [prompt], eos_token_id=2, max_new_tokens=6, temperature=None)[0]
        for prompt in PROMPTS
    ]
    assert batched == one_by_one


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
