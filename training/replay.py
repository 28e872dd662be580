"""The forgetting guard's data: the base model's own answers to a general prompt set.

Every project has it, reviewed good traces or not. Training pulls the student towards the base
(KL on these replies, `base_kl_weight`), so a lesson from a few reviewed traces does not
overwrite what the model knew. The prompts are general and varied, and none of them is a gate
regression prompt (training/eval_sets.py): the guard must not be trained on the gate's test.
A run on turns served with tools also gets the base's answers after a tool result in a few
general tool episodes: its targets (a call, an answer after a failure) never show that turn.
"""

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.chat import assistant_message_from_text, render_prompt
from training.eval_sets import REPLAY_PROMPTS, TOOL_REPLAY_EPISODES, TOOL_REPLAY_SYSTEM_PROMPT
from training.sampling import generate_replies
from training.trainer import Example

# Replies long enough to carry the model's manner, short enough to cost little to train on.
REPLAY_MAX_NEW_TOKENS = 64


def base_replay_examples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompts: Sequence[str] = REPLAY_PROMPTS,
    cache_dir: Path | None = None,
    batch_size: int = 8,
) -> list[Example]:
    """The base's greedy answers to `prompts` as examples; call before the adapter is added.

    Greedy answers of one base model never change, so they are cached in `cache_dir` (keyed
    by the model's weights file, the prompts and the length) and generated once per base.
    """
    cache = _cache_file(model, prompts, cache_dir) if cache_dir is not None else None
    if cache is not None and cache.exists():
        answers = json.loads(cache.read_text())
    else:
        answers = []
        eos = tokenizer.eos_token_id
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            replies = generate_replies(
                model,
                [render_prompt(tokenizer, _context(prompt)) for prompt in chunk],
                eos_token_id=eos,
                max_new_tokens=REPLAY_MAX_NEW_TOKENS,
                temperature=None,
            )
            answers.extend(tokenizer.decode(reply, skip_special_tokens=True) for reply in replies)
        if cache is not None:
            _write_cache(cache, answers)
    return [
        Example(_context(prompt), assistant_message_from_text(answer.strip()))
        for prompt, answer in zip(prompts, answers, strict=True)
        if answer.strip()
    ]


def _context(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _cache_file(model: PreTrainedModel, prompts: Sequence[str], cache_dir: Path) -> Path:
    key = json.dumps(
        [getattr(model.config, "_name_or_path", ""), list(prompts), REPLAY_MAX_NEW_TOKENS]
    )
    return cache_dir / f"replay-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def base_tool_replay_examples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    episodes: Sequence[tuple[str, str, str, str, str, str]] = TOOL_REPLAY_EPISODES,
    cache_dir: Path | None = None,
) -> list[Example]:
    """The base's greedy answers after a tool result, one per episode, as examples (with the
    episode's tool); cached like `base_replay_examples`."""
    contexts = [_tool_context(*episode) for episode in episodes]
    cache = (
        _cache_file(model, [json.dumps(context) for context, _ in contexts], cache_dir)
        if cache_dir is not None
        else None
    )
    if cache is not None and cache.exists():
        answers = json.loads(cache.read_text())
    else:
        replies = generate_replies(
            model,
            [render_prompt(tokenizer, context, tools) for context, tools in contexts],
            eos_token_id=tokenizer.eos_token_id,
            max_new_tokens=REPLAY_MAX_NEW_TOKENS,
            temperature=None,
        )
        answers = [tokenizer.decode(reply, skip_special_tokens=True) for reply in replies]
        if cache is not None:
            _write_cache(cache, answers)
    return [
        Example(context, assistant_message_from_text(answer.strip()), tools)
        for (context, tools), answer in zip(contexts, answers, strict=True)
        if answer.strip()
    ]


def _tool_context(
    tool: str, description: str, parameter: str, question: str, argument: str, result: str
) -> tuple[list[dict], list[dict]]:
    definition = {
        "type": "function",
        "function": {
            "name": tool,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {parameter: {"type": "string"}},
                "required": [parameter],
            },
        },
    }
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps({parameter: argument})},
    }
    context = [
        {"role": "system", "content": TOOL_REPLAY_SYSTEM_PROMPT},
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
    ]
    return context, [definition]


def _write_cache(cache: Path, answers: list[str]) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(".partial")
    partial.write_text(json.dumps(answers))
    partial.replace(cache)
