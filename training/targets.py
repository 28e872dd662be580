"""Self-distillation targets: the contexts student and teacher see, checks, and proposals.

Everything here takes and returns plain data (OpenAI-shape message dicts); the teachers are the
only part that runs a model, behind the `Teacher` protocol.
- student context x: the messages the model saw before the turn the feedback is about;
- `hint` teacher context (SDPO-style): x with the feedback appended to the last user/tool
  message, WITHOUT the original answer (showing it anchors the teacher to it), after the
  reviewers' own corrections under the same feedback as worked examples, when there are some;
- `rewrite` teacher context (ILF-style): x + the original answer + a request to rewrite it.
"""

import copy
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from itertools import zip_longest
from typing import Any, Literal, Protocol

import httpx
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.chat import Message, assistant_message_from_text, message_text, render_prompt
from training.checks import CheckResult, check_reply, passes_every_check
from training.sampling import AnchoredEdit, generate_edits, generate_replies

# The worker's sampling (reviewapp/learning/proposals.py, bench/learning.py): rounds of
# TEACHER_SAMPLES_PER_ROUND until a revision passes the checks or TEACHER_BUDGET samples are
# spent: the bundled model follows some feedback 1 time in 16.
TEACHER_SAMPLES_PER_ROUND = 4
TEACHER_BUDGET = 16

# How long a revision may be: at least MIN_REVISION_TOKENS, else room for one as long as the
# answer it revises and then some, at most MAX_REVISION_TOKENS. A fixed 64 cut every revision of
# a long answer: on bench/lessons.py, 6 of 8 answers cut at 96 tokens got no target for "Do not
# use the word 'very'" (one asked again: all 16 revisions "truncated at max_tokens").
MIN_REVISION_TOKENS = 64
MAX_REVISION_TOKENS = 320


# The teacher's edit of the original answer (config.teacher_edits): the original's token is kept
# wherever the teacher gives it at least this probability, as the guard's edited replay keeps
# the base's (training/replay.py). Over a model server an edit costs one request a token: one
# that keeps rewriting stops being an edit, and after EDIT_ROUNDS tokens of its own the teacher
# finishes the answer in one request.
EDIT_KEEP_AT_LEAST = 0.1
EDIT_ROUNDS = 24


def revision_budget(original: Message) -> int:
    """Tokens a teacher may write revising `original`: 1.5x its length + 16, within bounds.
    Its length is estimated from its characters (3 a token: English runs nearer 4, so the
    estimate errs long, and a budget is a limit, not a length the teacher aims for)."""
    calls = original.get("tool_calls")
    characters = len(message_text(original)) + (len(json.dumps(calls)) if calls else 0)
    estimate = int(characters / 3 * 1.5) + 16
    return max(MIN_REVISION_TOKENS, min(MAX_REVISION_TOKENS, estimate))


# Measured on the bundled SmolLM2-135M with "Always begin your answer with 'Answer:'" over 8
# questions (64 samples at temperature 0.7): this wording 26/64 followed, the same in
# parentheses 8/64, "Follow this feedback in your answer: ..." 21/64, "Important: ..." 1/64.
HINT_TEMPLATE = "\n\nReviewer feedback to follow in your answer: {feedback}"
REWRITE_REQUEST_TEMPLATE = (
    "Rewrite your previous answer so that it follows this feedback: {feedback}\n"
    "Reply with the rewritten answer only."
)


@dataclass(frozen=True)
class WorkedExample:
    """A reviewer's correction under the same feedback on another trace: shown to the teacher
    as an earlier exchange, it says what following the feedback looks like better than the
    feedback's words do. Measured on the bundled model over 12 questions ("End every answer
    with 'Hope this helps.'", 16 samples each): 3 of 12 got a passing revision from the feedback
    alone, 12 of 12 with 4 worked examples.

    The exchange runs from the corrected turn's user message up to that turn, tool calls and
    results included, so a correction that calls a tool, or that answers after a failed tool
    result, is shown where it was done and as what it is (a call, not its missing words)."""

    exchange: tuple[Message, ...]  # from the last user message up to the corrected turn
    answer: Message  # the corrected turn: a reply or a tool call

    @classmethod
    def reply(cls, question: str, answer: str) -> "WorkedExample":
        """A one-turn example: a question and its corrected answer."""
        return cls(
            ({"role": "user", "content": question},), {"role": "assistant", "content": answer}
        )

    @classmethod
    def ending(cls, context: Sequence[Message], answer: Message) -> "WorkedExample | None":
        """The example a correction makes of the context before it: the turns from its last
        user message on (earlier exchanges of a long episode say nothing about this one);
        None when the context has no user message."""
        users = [i for i, message in enumerate(context) if message["role"] == "user"]
        if not users:
            return None
        return cls(tuple(copy.deepcopy(list(context[users[-1] :]))), copy.deepcopy(answer))

    @property
    def size(self) -> int:
        """The characters it adds to the teacher's context, tool calls included."""
        return len(json.dumps([*self.exchange, self.answer]))


@dataclass(frozen=True)
class LessonHint:
    """A lesson as the teacher is shown it: the feedback's text and worked examples of it."""

    feedback: str
    examples: tuple[WorkedExample, ...] = ()


@dataclass(frozen=True)
class Proposal:
    """One teacher revision of the turn; `passes_checks` is False when `failures` is not empty."""

    text: str
    message: Message
    passes_checks: bool
    # Why it cannot be a target: failed checks ("regex '^Answer:'") or "truncated at max_tokens".
    failures: tuple[str, ...] = field(default=())
    # The project's earlier lessons it does not follow (their texts): it can still be a target,
    # but one that keeps them is preferred (see propose_targets' `unkept_lessons`).
    unkept: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class SampleRequest:
    """One round of sampling: `n` replies to `messages`, each at most `max_tokens` long."""

    messages: list[Message]
    n: int
    max_tokens: int
    temperature: float
    tools: list[dict] | None = None


@dataclass(frozen=True)
class TeacherSample:
    message: Message
    # Stopped by max_tokens rather than by ending its turn: an unfinished answer.
    truncated: bool


@dataclass(frozen=True)
class EditRequest:
    """The teacher's greedy edit of the answer `original` under `messages`: the original's next
    token wherever the teacher gives it at least `keep_at_least`, its own token elsewhere
    (training.sampling.generate_edits), at most `max_tokens` in all."""

    messages: list[Message]
    original: str
    max_tokens: int
    tools: list[dict] | None = None
    keep_at_least: float = EDIT_KEEP_AT_LEAST


class Teacher(Protocol):
    def sample(self, request: SampleRequest) -> list[TeacherSample]: ...

    # None where the teacher cannot score given tokens (an endpoint that is not vLLM).
    def edit(self, request: EditRequest) -> TeacherSample | None: ...


def student_context(messages: list[Message], turn: int) -> list[Message]:
    """What the model saw before writing assistant turn `turn`."""
    return copy.deepcopy(messages[:turn])


def resolve_turn(messages: list[Message], turn: int | None) -> int:
    """The assistant turn a piece of feedback is about; trace-level feedback means the last one."""
    if turn is None:
        assistant_turns = [
            i for i, message in enumerate(messages) if message["role"] == "assistant"
        ]
        if not assistant_turns:
            raise ValueError("the trace has no assistant turn to apply feedback to")
        return assistant_turns[-1]
    if not 0 <= turn < len(messages) or messages[turn]["role"] != "assistant":
        raise ValueError(f"message {turn} is not an assistant turn of this trace")
    return turn


def hint_context(
    student_context: list[Message],
    feedback_text: str,
    examples: Sequence[WorkedExample] = (),
) -> list[Message]:
    """The student context with the feedback appended to its last user/tool message, preceded
    (after any leading system messages) by the worked examples as earlier exchanges, each
    carrying the same feedback where the context does."""
    hint = HINT_TEMPLATE.format(feedback=feedback_text)
    context = _with_hint(student_context, hint)
    shown = [
        turn
        for example in examples
        for turn in [*_with_hint(example.exchange, hint), copy.deepcopy(example.answer)]
    ]
    system = 0
    while system < len(context) and context[system]["role"] == "system":
        system += 1
    return [*context[:system], *shown, *context[system:]]


def lessons_context(
    student_context: list[Message],
    lessons: Sequence[LessonHint],
    max_examples: int = 4,  # as many as the worker shows the teacher under one feedback
) -> list[Message]:
    """The teacher's context under every lesson at once: their feedback as one hint, and up to
    `max_examples` worked examples taken in turn from each lesson (the teacher's own prompt,
    hint_context, for one lesson)."""
    if not lessons:
        raise ValueError("no lesson to show the teacher")
    feedback = " ".join(lesson.feedback.strip() for lesson in lessons)
    in_turn = [
        example
        for round_ in zip_longest(*(lesson.examples for lesson in lessons))
        for example in round_
        if example is not None
    ]
    return hint_context(student_context, feedback, in_turn[:max_examples])


def _with_hint(messages: Sequence[Message], hint: str) -> list[Message]:
    """A copy of `messages` with `hint` appended to the last user or tool message."""
    hinted = copy.deepcopy(list(messages))
    for message in reversed(hinted):
        if message["role"] in ("user", "tool"):
            message["content"] = message_text(message) + hint
            return hinted
    raise ValueError("the context has no user or tool message to attach the feedback to")


def rewrite_context(
    student_context: list[Message], original_turn: Message, feedback_text: str
) -> list[Message]:
    """The student context, the original answer, then a request to rewrite it per the feedback."""
    return [
        *copy.deepcopy(student_context),
        copy.deepcopy(original_turn),
        {"role": "user", "content": REWRITE_REQUEST_TEMPLATE.format(feedback=feedback_text)},
    ]


def run_checks(
    reply: str | Message, checks: Sequence[dict], *, context: Sequence[Message] = ()
) -> list[CheckResult]:
    """Each check (`{"kind", "value"}`) applied to a reply (generated text or a message) given
    the messages before it."""
    return check_reply(checks, reply, context=context)


def select_revisions(
    candidates: Sequence[str | Message], checks: Sequence[dict]
) -> list[str | Message]:
    """The candidates that pass every check, in order, without duplicates or empty replies."""
    kept, seen = [], set()
    for candidate in candidates:
        key = _dedup_key(candidate)
        if key in seen or key == ("", ()):
            continue
        seen.add(key)
        if passes_every_check(checks, candidate):
            kept.append(candidate)
    return kept


def propose_targets(
    teacher: Teacher,
    trace_messages: list[Message],
    turn: int | None,
    feedback_text: str,
    checks: Sequence[dict],
    prompt: Literal["hint", "rewrite"] = "hint",
    n: int = 4,
    max_tokens: int | None = None,
    temperature: float = 0.7,
    tools: list[dict] | None = None,
    want: int = 1,
    budget: int = 4,
    examples: Sequence[WorkedExample] = (),
    unkept_lessons: Callable[[Message, list[Message]], tuple[str, ...]] | None = None,
    edit_original: bool = False,
) -> list[Proposal]:
    """The teacher's distinct revisions of the turn, best first, each marked with whether it
    can be a target.

    Samples `n` at a time until `want` of them pass the checks or `budget` samples are spent
    (a teacher that follows the feedback 1 time in 16 still yields a target). Best first:
    passing ones, then the closest to the original answer (the smallest change that does what
    the feedback asked keeps the rest of the answer, facts included). Failing proposals are
    returned too, with reasons, so the caller can count what the checks excluded. `examples`
    (reviewers' corrections under the same feedback) are shown to a `hint` teacher.
    `max_tokens`: each revision's limit (default: the original answer's revision_budget).

    `unkept_lessons(message, context)`: the earlier lessons a revision does not follow. With
    it, sampling goes on until `want` passing revisions keep them all (or the budget is spent),
    and passing revisions that keep them come first: a target for a new lesson that breaks an
    earlier one teaches the model to break it (an ending appended to answers the team had
    taught to stay under 40 words took them over it: bench/README.md).

    `edit_original`: the teacher's greedy edit of the original answer is a proposal too, before
    the samples (a text answer only). It changes the answer only where the teacher finds the
    original's words unlikely, so where it passes it is the smallest change the feedback asked
    for ("Answer: Cats are known to be curious...", where samples read "Answer: The answer to
    this question is that cats..."), and the closest to the original.
    """
    turn = resolve_turn(trace_messages, turn)
    context = student_context(trace_messages, turn)
    max_tokens = max_tokens or revision_budget(trace_messages[turn])
    if prompt == "hint":
        teacher_context = hint_context(context, feedback_text, examples)
    elif prompt == "rewrite":
        teacher_context = rewrite_context(context, trace_messages[turn], feedback_text)
    else:
        raise ValueError(f"prompt must be 'hint' or 'rewrite', not {prompt!r}")

    proposals, seen, sampled = [], set(), 0

    def propose(sample: TeacherSample) -> None:
        key = _dedup_key(sample.message)
        if key in seen or key == ("", ()):
            return
        seen.add(key)
        failures = [
            f"{result.kind} {result.value!r}"
            for result in run_checks(sample.message, checks, context=context)
            if not result.passed
        ]
        if sample.truncated:
            failures.append("truncated at max_tokens")
        proposals.append(
            Proposal(
                text=message_text(sample.message),
                message=sample.message,
                passes_checks=not failures,
                failures=tuple(failures),
                unkept=unkept_lessons(sample.message, context) if unkept_lessons else (),
            )
        )

    original = message_text(trace_messages[turn])
    if edit_original and original.strip() and not trace_messages[turn].get("tool_calls"):
        edited = teacher.edit(EditRequest(teacher_context, original, max_tokens, tools))
        if edited is not None:
            propose(edited)
    while sampled < budget and sum(p.passes_checks and not p.unkept for p in proposals) < want:
        count = min(n, budget - sampled)
        sampled += count
        for sample in teacher.sample(
            SampleRequest(teacher_context, count, max_tokens, temperature, tools)
        ):
            propose(sample)
    return sorted(
        proposals,
        key=lambda p: (
            not p.passes_checks,
            bool(p.unkept),
            -SequenceMatcher(None, original, p.text).ratio(),
        ),
    )


class VllmTeacher:
    """Samples from an OpenAI-compatible server (vLLM), `n` choices in one request; seeded."""

    def __init__(
        self,
        base_url: str,
        model: str,
        client: httpx.Client,
        api_key: str | None = None,
        seed: int = 0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model  # the served base name, or a loaded adapter's name
        self.client = client
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.seed = seed

    def sample(self, request: SampleRequest) -> list[TeacherSample]:
        body: dict[str, Any] = {
            "messages": request.messages,
            "n": request.n,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            # The same feedback on the same trace gets the same proposals, so a run can be
            # repeated (and a test's outcome is not a draw). vLLM gives the i-th of the n
            # choices seed + i, so the next round starts past them.
            "seed": self.seed,
        }
        self.seed += request.n
        if request.tools:
            body["tools"] = request.tools
        choices = self._post(f"{self.base_url}/chat/completions", body)["choices"]
        return [
            TeacherSample(
                message=_assistant_message(choice["message"]),
                truncated=choice.get("finish_reason") == "length",
            )
            for choice in choices
        ]

    def edit(self, request: EditRequest) -> TeacherSample | None:
        """The edit written over the server's token ids, one greedy token a request with its
        most likely alternatives: the original's next token where it is among them with at
        least `keep_at_least` (no more than 1 / keep_at_least tokens can be), else the teacher's
        own. Not scored with `prompt_logprobs`: on the CPU build with a LoRA adapter in the
        batch it stops the engine. None where the endpoint will not tokenize (it is not vLLM):
        samples only."""
        prompt = self._tokens(
            {"messages": request.messages, "add_generation_prompt": True}
            | ({"tools": request.tools} if request.tools else {})
        )
        if prompt is None:
            return None
        first, after_words = (
            self._tokens({"prompt": text, "add_special_tokens": False})
            for text in anchor_texts(request.original)
        )
        edit = AnchoredEdit(first or [], after_words)
        alternatives = math.ceil(1 / request.keep_at_least) if request.keep_at_least > 0 else 20
        own_tokens = 0
        while edit.rest() and own_tokens < EDIT_ROUNDS:
            if len(edit.written) >= request.max_tokens:
                return self._finished(edit.written, "", truncated=True)
            step = self._completion(
                prompt + edit.written, max_tokens=1, logprobs=min(alternatives, 20)
            )
            likely = defaultdict(
                float,  # a token not among the alternatives: less likely than every one of them
                {
                    int(token.removeprefix("token_id:")): math.exp(logprob)
                    for token, logprob in step["logprobs"]["top_logprobs"][0].items()
                },
            )
            if edit.keeps(likely, request.keep_at_least):
                continue
            if step["finish_reason"] == "stop":  # the teacher ends the answer here
                return self._finished(edit.written, "", truncated=False)
            edit.write(int(step["logprobs"]["tokens"][0].removeprefix("token_id:")))
            own_tokens += 1
        # Past the original (or EDIT_ROUNDS tokens of its own): the teacher writes the rest.
        room = request.max_tokens - len(edit.written)
        if room <= 0:
            return self._finished(edit.written, "", truncated=True)
        more = self._completion(prompt + edit.written, max_tokens=room)
        truncated = more["finish_reason"] == "length"
        return self._finished(edit.written, more["text"], truncated=truncated)

    def _tokens(self, body: dict) -> list[int] | None:
        """The server's token ids for a prompt or messages (vLLM's /tokenize); None where it
        has no such thing."""
        try:
            tokens = self._post(f"{self._root}/tokenize", body).get("tokens")
        except httpx.HTTPStatusError:
            return None
        return tokens if isinstance(tokens, list) else None

    def _finished(self, written: list[int], more: str, *, truncated: bool) -> TeacherSample:
        text = ""
        if written:
            text = self._post(f"{self._root}/detokenize", {"tokens": written})["prompt"]
        return TeacherSample(assistant_message_from_text((text + more).strip()), truncated)

    def _completion(self, prompt: list[int], **options: Any) -> dict:
        """One greedy completion of token ids; tokens named by id ("token_id:42")."""
        body = {"prompt": prompt, "temperature": 0, "return_tokens_as_token_ids": True}
        return self._post(f"{self.base_url}/completions", body | options)["choices"][0]

    @property
    def _root(self) -> str:
        """The server's own routes (/tokenize) sit beside /v1, not under it."""
        return self.base_url.removesuffix("/v1")

    def _post(self, url: str, body: dict) -> dict:
        response = self.client.post(url, json={"model": self.model} | body, headers=self.headers)
        response.raise_for_status()
        return response.json()


class TransformersTeacher:
    """Samples in process with a Hugging Face model (with or without an adapter); seeded."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, seed: int = 0
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.seed = seed

    def sample(self, request: SampleRequest) -> list[TeacherSample]:
        prompt_ids = render_prompt(self.tokenizer, request.messages, request.tools)
        # Each call draws from its own seed so proposals repeat run to run without touching
        # the caller's random state.
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.seed += 1
            replies = generate_replies(
                self.model,
                [prompt_ids] * request.n,
                eos_token_id=self.tokenizer.eos_token_id,
                max_new_tokens=request.max_tokens,
                temperature=request.temperature,
            )
        return [
            TeacherSample(
                message=assistant_message_from_text(
                    self.tokenizer.decode(reply, skip_special_tokens=True)
                ),
                truncated=reply[-1:] != [self.tokenizer.eos_token_id],
            )
            for reply in replies
        ]

    def edit(self, request: EditRequest) -> TeacherSample | None:
        (reply,) = edit_replies(
            self.model,
            self.tokenizer,
            [render_prompt(self.tokenizer, request.messages, request.tools)],
            [request.original],
            max_new_tokens=request.max_tokens,
            keep_at_least=request.keep_at_least,
        )
        return TeacherSample(
            message=assistant_message_from_text(
                self.tokenizer.decode(reply, skip_special_tokens=True).strip()
            ),
            truncated=reply[-1:] != [self.tokenizer.eos_token_id],
        )


def anchor_texts(answer: str) -> tuple[str, str]:
    """An answer as it begins a reply, and as it reads after words put in front of it (a space
    before its first word): the two anchors of an edit (training.sampling.AnchoredEdit)."""
    answer = answer.strip()
    return answer, " " + answer


def edit_replies(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    originals: Sequence[str],
    *,
    max_new_tokens: int,
    keep_at_least: float,
) -> list[list[int]]:
    """The model's greedy edit of each original answer under the same row's prompt, in process
    (generate_edits, the two anchors of anchor_texts). No end-of-turn token after the original:
    past its last word the model writes alone, and ends the answer or adds what a lesson puts
    at the end."""
    as_written = [anchor_texts(original) for original in originals]
    first = [tokenizer.encode(begins, add_special_tokens=False) for begins, _ in as_written]
    after_words = [tokenizer.encode(after, add_special_tokens=False) for _, after in as_written]
    return generate_edits(
        model,
        prompts,
        first,
        eos_token_id=tokenizer.eos_token_id,
        max_new_tokens=max_new_tokens,
        keep_at_least=keep_at_least,
        after_words=after_words,
    )


def _assistant_message(choice_message: dict) -> Message:
    message: Message = {"role": "assistant", "content": choice_message.get("content")}
    if choice_message.get("tool_calls"):
        message["tool_calls"] = choice_message["tool_calls"]
    return message


def _dedup_key(reply: str | Message) -> tuple[str, tuple]:
    message = assistant_message_from_text(reply) if isinstance(reply, str) else reply
    calls = tuple(
        (call["function"]["name"], call["function"].get("arguments"))
        for call in message.get("tool_calls") or []
    )
    return " ".join(message_text(message).split()), calls
