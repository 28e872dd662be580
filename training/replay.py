"""The forgetting guard's data: the base model's own answers to a general prompt set.

Every project has it, reviewed good traces or not. Training pulls the student towards the base
(KL on these replies, `base_kl_weight`), so a lesson from a few reviewed traces does not
overwrite what the model knew. The prompts are general and varied, and none of them is a gate
regression prompt (training/eval_sets.py): the guard must not be trained on the gate's test.
A run on turns served with tools also gets the base's answers after a tool result in a few
general tool episodes: its targets (a call, an answer after a failure) never show that turn.

With lessons (config.guard_reference "lessons"), the general prompts are answered by the
teacher instead: the base shown every lesson of the run, as it is shown them when it proposes
targets. The guard then pulls the student, on questions nobody reviewed, towards what the
prompted model does there. Pulled towards the base itself, the student unlearns the lessons on
every question it did not train on (bench/README.md, "The guard's reference"). With "both"
(training/job.py) the base answers every other prompt and the teacher the rest. With
"lesson_changes" the teacher answers them all, and the trainer takes the teacher as the
reference only at the tokens where its answer leaves what the base would write. With
"lesson_edits" the answers are the base's own, edited by the teacher: at each token the base's
choice, unless the teacher shown the lessons finds it unlikely. The teacher alone, shown
reviewers' corrections as worked examples, copies their openers ("The answer to this question is
rooted in...") onto questions the base answers outright ("12 times 3 is 36."), and a student
pulled towards those answers stops stating facts (bench/README.md, "The base's answers, edited
by the teacher"). With "aligned_edits" the teacher edits the base's finished answer, and each
example carries that answer as its `anchor`: where a lesson puts words in front ("Answer:"),
the base's choice after them is its choice after "Answer:" ("Poland is a country located
in..."), its finished answer still says "The capital of Poland is Warsaw." (the trainer takes
the base's reference at every token copied from it, training/trainer.py).
"""

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.chat import assistant_message_from_text, render_prompt
from training.eval_sets import REPLAY_PROMPTS, TOOL_REPLAY_EPISODES, TOOL_REPLAY_SYSTEM_PROMPT
from training.evaluation import MAX_EVAL_TOKENS
from training.sampling import generate_anchored, generate_replies
from training.targets import LessonHint, edit_replies, lessons_context
from training.trainer import Example

# Replies long enough to carry the model's manner, short enough to cost little to train on.
REPLAY_MAX_NEW_TOKENS = 64
# The teacher's answers run as long as the gate's: a lesson about how an answer ends is only
# seen at its end.
LESSON_REPLAY_MAX_NEW_TOKENS = MAX_EVAL_TOKENS
# "lesson_edits": the base's token stays wherever the teacher gives it at least this probability.
# On the 40 general prompts under two lessons (of the test set: bench/README.md says so), 0.1
# kept the base's first sentence in 17 and 13 answers (the teacher alone: 6 and 9) with the
# lesson followed in 38 and 35; 0.3 kept 7 and 9.
LESSON_EDIT_KEEP_AT_LEAST = 0.1

# How the teacher edits the base's answers: "next_token", the base's next token under the reply
# written so far ("lesson_edits"); "answer", the base's finished answer ("aligned_edits").
BaseEdits = Literal["next_token", "answer"]


def base_replay_examples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompts: Sequence[str] = REPLAY_PROMPTS,
    cache_dir: Path | None = None,
    batch_size: int = 8,
) -> list[Example]:
    """The base's greedy answers to `prompts` as examples; call before the adapter is added."""
    conversations = [([{"role": "user", "content": prompt}], None) for prompt in prompts]
    answers = _greedy_answers(
        model, tokenizer, conversations, REPLAY_MAX_NEW_TOKENS, cache_dir, batch_size
    )
    return _examples(conversations, answers)


def lesson_replay_examples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lessons: Sequence[LessonHint],
    *,
    prompts: Sequence[str] = REPLAY_PROMPTS,
    cache_dir: Path | None = None,
    batch_size: int = 8,
    base_edits: BaseEdits | None = None,
) -> list[Example]:
    """The teacher's greedy answers to `prompts`, shown every lesson, as examples whose context
    is the bare prompt and whose `teacher_context` is what the teacher saw: the guard's base
    side is computed there. With `base_edits`, each answer is the base's own to the bare prompt
    but where the teacher finds the base's token unlikely: its next token as it writes
    ("next_token", generate_anchored) or its finished answer ("answer", generate_edits; the
    example's `anchor` is that answer). Call before the adapter is added."""
    contexts = [[{"role": "user", "content": prompt}] for prompt in prompts]
    shown = [(lessons_context(context, lessons), None) for context in contexts]
    anchors: list[str | None] = [None] * len(contexts)
    if base_edits == "answer":
        bare = [(context, None) for context in contexts]
        anchors = _greedy_answers(
            model, tokenizer, bare, LESSON_REPLAY_MAX_NEW_TOKENS, cache_dir, batch_size
        )
        answers = _edited_answers(model, tokenizer, shown, anchors, cache_dir, batch_size)
    else:
        answers = _greedy_answers(
            model,
            tokenizer,
            shown,
            LESSON_REPLAY_MAX_NEW_TOKENS,
            cache_dir,
            batch_size,
            anchors=contexts if base_edits == "next_token" else None,
        )
    return [
        Example(
            context,
            assistant_message_from_text(answer.strip()),
            teacher_context=seen,
            anchor=assistant_message_from_text(anchor.strip()) if anchor else None,
        )
        for context, (seen, _), answer, anchor in zip(
            contexts, shown, answers, anchors, strict=True
        )
        if answer.strip()
    ]


def base_tool_replay_examples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    episodes: Sequence[tuple[str, str, str, str, str, str]] = TOOL_REPLAY_EPISODES,
    cache_dir: Path | None = None,
    batch_size: int = 8,
) -> list[Example]:
    """The base's greedy answers after a tool result, one per episode, as examples (with the
    episode's tool); call before the adapter is added."""
    conversations = [_tool_context(*episode) for episode in episodes]
    answers = _greedy_answers(
        model, tokenizer, conversations, REPLAY_MAX_NEW_TOKENS, cache_dir, batch_size
    )
    return _examples(conversations, answers)


def _examples(
    conversations: list[tuple[list[dict], list[dict] | None]], answers: list[str]
) -> list[Example]:
    """Each (context, tools) with its answer as an example; empty answers left out."""
    return [
        Example(context, assistant_message_from_text(answer.strip()), tools)
        for (context, tools), answer in zip(conversations, answers, strict=True)
        if answer.strip()
    ]


def _greedy_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[tuple[list[dict], list[dict] | None]],
    max_new_tokens: int,
    cache_dir: Path | None,
    batch_size: int,
    anchors: list[list[dict]] | None = None,
) -> list[str]:
    """The base's greedy reply to each (context, tools); with `anchors` (one bare context per
    conversation), anchored on each: the base's reply there, edited where the conversation
    makes its token unlikely.

    Greedy answers of one base model never change, so they are cached in `cache_dir` (keyed
    by the model's weights file, the conversations, the anchors and the length) and generated
    once per base and set of lessons.
    """
    key = [getattr(model.config, "_name_or_path", ""), conversations, max_new_tokens]
    if anchors is not None:
        key += [anchors, LESSON_EDIT_KEEP_AT_LEAST]

    def generate() -> list[str]:
        answers = []
        for start in range(0, len(conversations), batch_size):
            prompts = [
                render_prompt(tokenizer, context, tools)
                for context, tools in conversations[start : start + batch_size]
            ]
            if anchors is None:
                replies = generate_replies(
                    model,
                    prompts,
                    eos_token_id=tokenizer.eos_token_id,
                    max_new_tokens=max_new_tokens,
                    temperature=None,
                )
            else:
                replies = generate_anchored(
                    model,
                    prompts,
                    [render_prompt(tokenizer, a) for a in anchors[start : start + batch_size]],
                    eos_token_id=tokenizer.eos_token_id,
                    max_new_tokens=max_new_tokens,
                    keep_at_least=LESSON_EDIT_KEEP_AT_LEAST,
                )
            answers.extend(tokenizer.decode(reply, skip_special_tokens=True) for reply in replies)
        return answers

    return _cached(key, cache_dir, generate)


def _edited_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    shown: list[tuple[list[dict], list[dict] | None]],
    anchors: list[str],
    cache_dir: Path | None,
    batch_size: int,
) -> list[str]:
    """The model's greedy reply to each of the `shown` conversations, editing the same row's
    finished answer in `anchors` where the conversation makes its next token unlikely
    (generate_edits); cached as _greedy_answers' are."""
    key = [getattr(model.config, "_name_or_path", ""), shown, anchors]
    key += [LESSON_REPLAY_MAX_NEW_TOKENS, LESSON_EDIT_KEEP_AT_LEAST]

    def generate() -> list[str]:
        answers = []
        for start in range(0, len(shown), batch_size):
            rows = slice(start, start + batch_size)
            replies = edit_replies(
                model,
                tokenizer,
                [render_prompt(tokenizer, context, tools) for context, tools in shown[rows]],
                anchors[rows],
                max_new_tokens=LESSON_REPLAY_MAX_NEW_TOKENS,
                keep_at_least=LESSON_EDIT_KEEP_AT_LEAST,
            )
            answers.extend(tokenizer.decode(reply, skip_special_tokens=True) for reply in replies)
        return answers

    return _cached(key, cache_dir, generate)


def _cached(key: list, cache_dir: Path | None, generate: Callable[[], list[str]]) -> list[str]:
    """`generate()`'s answers, kept in `cache_dir` under `key` (one base's greedy answers never
    change) and read from there after the first time."""
    cache = _cache_file(key, cache_dir) if cache_dir is not None else None
    if cache is not None and cache.exists():
        return json.loads(cache.read_text())
    answers = generate()
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(".partial")
        partial.write_text(json.dumps(answers))
        partial.replace(cache)
    return answers


def _cache_file(key: list, cache_dir: Path) -> Path:
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    return cache_dir / f"replay-{digest}.json"


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
