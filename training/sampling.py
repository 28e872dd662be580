"""Generating replies with a model and scoring given replies, batched, on token ids.

Shared by the teacher (proposals), the trainer (the student's on-policy samples, the teacher's
and the base model's logits) and the evaluation (greedy replies, divergence).
"""

import contextlib
from collections.abc import Iterator, Mapping

import torch
from peft import PeftModel
from transformers import PreTrainedModel


def generate_replies(
    model: PreTrainedModel,
    prompts: list[list[int]],
    *,
    eos_token_id: int,
    max_new_tokens: int,
    temperature: float | None,
) -> list[list[int]]:
    """One reply per prompt: greedy when `temperature` is None, else plain sampling.

    A reply ends with its end-of-turn token if the model wrote one within `max_new_tokens`;
    nothing after it is kept. Sampling draws from the full distribution (no top-k/top-p), as
    vLLM does by default, so the samples are the model's own.
    """
    # Left padding: every prompt ends at the same column, where generation starts.
    input_ids, attention_mask = _left_padded(prompts, eos_token_id, model.device)
    sampling = (
        {"do_sample": False}
        if temperature is None
        else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_token_id,
                pad_token_id=eos_token_id,
                **sampling,
            )
    finally:
        model.train(was_training)
    return _until_end(output[:, input_ids.shape[1] :].tolist(), eos_token_id)


def reply_logits(
    model: PreTrainedModel, prompts: list[list[int]], replies: list[list[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits for each reply token given its prompt, aligned on the reply.

    Returns `logits` [B, R, V] where `logits[b, t]` is the distribution the model gave reply
    token t of row b, and `mask` [B, R] marking real reply tokens (R: the longest reply).
    Gradients flow unless the caller disables them. Full-vocabulary logits are computed only
    from the shortest prompt's end on: the prompts' logits would be thrown away.
    """
    device = model.device
    sequences = [prompt + reply for prompt, reply in zip(prompts, replies, strict=True)]
    input_ids, attention_mask = pad_right(sequences, pad_token_id, device)
    # Token at position p is predicted by the logits at p - 1.
    first = min(len(prompt) for prompt in prompts) - 1
    window = torch.arange(first, input_ids.shape[1], device=device)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=window, use_cache=False
    ).logits
    reply_width = max(len(reply) for reply in replies)
    offsets = torch.arange(reply_width, device=device)
    starts = torch.tensor([len(prompt) - 1 - first for prompt in prompts], device=device)
    positions = (starts[:, None] + offsets).clamp_max(logits.shape[1] - 1)
    rows = torch.arange(len(prompts), device=device)[:, None]
    mask = (
        offsets[None, :] < torch.tensor([len(reply) for reply in replies], device=device)[:, None]
    )
    return logits[rows, positions], mask


def pad_right(
    sequences: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, T] with each sequence padded on the right."""
    return _padded(sequences, pad_token_id, device, left=False)


def adapter_disabled(model: PreTrainedModel) -> contextlib.AbstractContextManager:
    """Run the base model under a peft adapter (a plain model runs as it is)."""
    return model.disable_adapter() if isinstance(model, PeftModel) else contextlib.nullcontext()


@contextlib.contextmanager
def active_adapter(model: PeftModel, name: str | None) -> Iterator[None]:
    """Answer under the loaded adapter `name` inside the block (None: leave the model as is)."""
    if name is None or name == model.active_adapter:
        yield
        return
    previous = model.active_adapter
    model.set_adapter(name)
    try:
        yield
    finally:
        model.set_adapter(previous)


def weights_of(model: PreTrainedModel, adapter: str | None) -> contextlib.AbstractContextManager:
    """Answer as the loaded adapter `adapter` inside the block, or as the base (None)."""
    return active_adapter(model, adapter) if adapter else adapter_disabled(model)


def generate_anchored(
    model: PreTrainedModel,
    prompts: list[list[int]],
    anchors: list[list[int]],
    *,
    eos_token_id: int,
    max_new_tokens: int,
    keep_at_least: float,
) -> list[list[int]]:
    """One greedy reply per prompt that writes, at each token, what the model would write
    under the same row's `anchor` prompt, wherever the model under `prompt` gives that token at
    least `keep_at_least` probability; elsewhere its own greedy token. Both sides read the
    reply written so far. At 0 the replies are the anchors' greedy ones; above 1, the prompts'.

    The forgetting guard's general answers (training/replay.py): the prompt shows the lessons,
    the anchor is the bare question, so an answer keeps the base's own wording and content and
    leaves it only where the lessons make the base's token unlikely.
    """
    if len(prompts) != len(anchors):
        raise ValueError("every prompt needs its anchor")
    device = model.device
    sides = [
        _left_padded(prompts, eos_token_id, device),
        _left_padded(anchors, eos_token_id, device),
    ]
    rows = len(prompts)
    written = torch.full((rows, 0), eos_token_id, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outputs = [_forward(model, ids, mask, None) for ids, mask in sides]
            for _ in range(max_new_tokens):
                prompted, anchored = (output.logits[:, -1] for output in outputs)
                anchor_token = anchored.argmax(dim=-1)
                likely = prompted.softmax(dim=-1).gather(1, anchor_token[:, None])[:, 0]
                token = torch.where(likely >= keep_at_least, anchor_token, prompted.argmax(dim=-1))
                token = torch.where(done, eos_token_id, token)
                written = torch.cat([written, token[:, None]], dim=1)
                done |= token == eos_token_id
                if done.all():
                    break
                sides = [
                    (token[:, None], torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1))
                    for _, mask in sides
                ]
                outputs = [
                    _forward(model, ids, mask, output.past_key_values)
                    for (ids, mask), output in zip(sides, outputs, strict=True)
                ]
    finally:
        model.train(was_training)
    return _until_end(written.tolist(), eos_token_id)


# An edit goes on from the anchor token after the one it wrote where that is among the anchor's
# next EDIT_LOOKAHEAD tokens (a word or two left out, or its first word spelled another way).
EDIT_LOOKAHEAD = 4
# Right after a token of its own, an edit also goes back to the anchor this many tokens further
# on: its token replaced a word, and the original's next word reads on after it. Without it an
# edit that replaced one word never found its way back (run Q, bench/README.md).
EDIT_REALIGN = 2


class AnchoredEdit:
    """A reply being written as an edit of a finished reply, the anchor: which of the anchor's
    tokens comes next, as the edit keeps some and writes its own (generate_edits; the teacher's
    edit over a model server, training/targets.py).

    `after_words` is the anchor as it reads after other words (its first word with a space
    before it, " The" where the anchor begins "The"): an edit whose first token is its own put
    words in front, and goes on with that."""

    def __init__(
        self,
        anchor: list[int],
        after_words: list[int] | None = None,
        lookahead: int = EDIT_LOOKAHEAD,
    ) -> None:
        self.anchor = anchor
        self.after_words = after_words if after_words is not None else anchor
        self.lookahead = lookahead
        self.at = 0  # the anchor's next token
        self.written: list[int] = []
        self.put_in = False  # the last token written was the edit's own, put in

    def rest(self) -> list[int]:
        """The anchor's tokens not yet kept or passed over."""
        return self.anchor[self.at :]

    def keep(self) -> None:
        """Write the anchor's next token."""
        self.written.append(self.anchor[self.at])
        self.at += 1
        self.put_in = False

    def keeps(self, probability: torch.Tensor | Mapping[int, float], keep_at_least: float) -> bool:
        """Keep the anchor's next token where `probability[token]` is at least `keep_at_least`;
        right after a token put in, also one of the EDIT_REALIGN after it (that token replaced
        the ones passed over). Whether one was kept."""
        reach = 1 + (EDIT_REALIGN if self.put_in else 0)
        for skipped, token in enumerate(self.anchor[self.at : self.at + reach]):
            if probability[token] >= keep_at_least:
                self.at += skipped
                self.keep()
                return True
        return False

    def write(self, token: int) -> None:
        """Write a token of the edit's own in place of the anchor's next: where it is among the
        anchor's next `lookahead`, the ones before it are left out; else it is put in."""
        if not self.written:
            self.anchor = self.after_words
        self.written.append(token)
        ahead = self.anchor[self.at : self.at + self.lookahead]
        self.put_in = token not in ahead
        if not self.put_in:
            self.at += ahead.index(token) + 1


def generate_edits(
    model: PreTrainedModel,
    prompts: list[list[int]],
    anchors: list[list[int]],
    *,
    eos_token_id: int,
    max_new_tokens: int,
    keep_at_least: float,
    after_words: list[list[int]] | None = None,
) -> list[list[int]]:
    """One greedy reply per prompt that edits the same row's finished reply `anchors[row]`: it
    keeps the anchor's next token wherever the model under `prompt` gives it at least
    `keep_at_least` probability; elsewhere it writes its own greedy token (AnchoredEdit: a word
    left out, or put in; once it puts words in front, the anchor as it reads after words,
    `after_words[row]`). Past the anchor's end the model writes alone.

    Unlike generate_anchored, whose anchor is a context and reads the reply written so far, the
    anchor here is the text: after a lesson puts "Answer:" in front, the reply goes on with the
    base's own "The capital of Poland is Warsaw.", not with what the base writes after
    "Answer:" ("Poland is a country located in...").
    """
    if len(prompts) != len(anchors):
        raise ValueError("every prompt needs its anchor")
    edits = [
        AnchoredEdit(anchor, after_words[row] if after_words is not None else None)
        for row, anchor in enumerate(anchors)
    ]
    input_ids, attention_mask = _left_padded(prompts, eos_token_id, model.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            output = _forward(model, input_ids, attention_mask, None)
            for _ in range(max_new_tokens):
                probabilities = output.logits[:, -1].softmax(dim=-1)
                greedy = probabilities.argmax(dim=-1).tolist()
                for row, edit in enumerate(edits):
                    if edit.written[-1:] == [eos_token_id]:
                        edit.written.append(eos_token_id)  # padding: only the reply is read
                    elif not edit.keeps(probabilities[row], keep_at_least):
                        edit.write(greedy[row])
                if all(eos_token_id in edit.written for edit in edits):
                    break
                step = torch.tensor([edit.written[-1] for edit in edits], device=model.device)
                attention_mask = torch.cat([attention_mask, torch.ones_like(step[:, None])], dim=1)
                output = _forward(model, step[:, None], attention_mask, output.past_key_values)
    finally:
        model.train(was_training)
    return _until_end([edit.written for edit in edits], eos_token_id)


def _until_end(rows: list[list[int]], eos_token_id: int) -> list[list[int]]:
    """Each row up to and including its first end-of-turn token; nothing after it is kept."""
    return [row[: row.index(eos_token_id) + 1] if eos_token_id in row else row for row in rows]


def _left_padded(
    sequences: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, T] with each sequence padded on the left, so that every
    row's next token is at the same column."""
    return _padded(sequences, pad_token_id, device, left=True)


def _padded(
    sequences: list[list[int]], pad_token_id: int, device: torch.device, *, left: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long, device=device)
    attention_mask = torch.zeros_like(input_ids)
    for row, sequence in enumerate(sequences):
        columns = slice(width - len(sequence), width) if left else slice(0, len(sequence))
        input_ids[row, columns] = torch.tensor(sequence, device=device)
        attention_mask[row, columns] = 1
    return input_ids, attention_mask


def _forward(model: PreTrainedModel, input_ids, attention_mask, past_key_values):
    """One cached step (or the prompt's pass) over left-padded rows: positions count only the
    real tokens, as generate() counts them; logits for the next token only (a long prompt's
    would be rows x tokens x the vocabulary)."""
    positions = (attention_mask.cumsum(dim=-1) - 1).clamp_min(0)[:, -input_ids.shape[1] :]
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=past_key_values,
        use_cache=True,
        logits_to_keep=1,
    )
