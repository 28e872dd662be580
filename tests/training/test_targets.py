import copy
import json

import httpx
import pytest

from training.targets import (
    HINT_TEMPLATE,
    MAX_REVISION_TOKENS,
    MIN_REVISION_TOKENS,
    EditRequest,
    LessonHint,
    Proposal,
    SampleRequest,
    TeacherSample,
    TransformersTeacher,
    VllmTeacher,
    WorkedExample,
    hint_context,
    lessons_context,
    propose_targets,
    resolve_turn,
    revision_budget,
    rewrite_context,
    run_checks,
    select_revisions,
    student_context,
)

FEEDBACK = "Always begin your answer with 'Answer:'"
ORIGINAL_ANSWER = "The capital of France is Paris, a city of lights."
TRACE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": ORIGINAL_ANSWER},
]
TOOL_TRACE = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny."},
]


class ScriptedTeacher:
    """A teacher that returns fixed samples and records the context it was shown."""

    def __init__(self, samples: list[TeacherSample]) -> None:
        self.samples = samples
        self.seen: list[list[dict]] = []
        self.max_tokens: list[int] = []

    def sample(self, request: SampleRequest) -> list[TeacherSample]:
        # Each request takes the next n samples, as a sampling teacher gives new ones each time.
        start = len(self.seen) * request.n
        self.seen.append(request.messages)
        self.max_tokens.append(request.max_tokens)
        return self.samples[start : start + request.n]

    def edit(self, request: EditRequest) -> TeacherSample | None:
        raise AssertionError("not asked for edits")


class EditingTeacher(ScriptedTeacher):
    """A scripted teacher whose edit of the original is fixed (None: it cannot edit)."""

    def __init__(self, samples: list[TeacherSample], edited: TeacherSample | None) -> None:
        super().__init__(samples)
        self.edited = edited
        self.edits: list[EditRequest] = []

    def edit(self, request: EditRequest) -> TeacherSample | None:
        self.edits.append(request)
        return self.edited


def _reply(text: str, truncated: bool = False) -> TeacherSample:
    return TeacherSample(message={"role": "assistant", "content": text}, truncated=truncated)


def test_student_context_is_everything_before_the_turn():
    assert student_context(TRACE, 2) == TRACE[:2]


def test_trace_level_feedback_applies_to_the_final_assistant_turn():
    assert resolve_turn(TOOL_TRACE, None) == 3


def test_a_turn_that_is_not_an_assistant_message_is_rejected():
    with pytest.raises(ValueError, match="not an assistant turn"):
        resolve_turn(TRACE, 1)


def test_hint_context_carries_the_feedback_but_not_the_original_answer():
    context = hint_context(student_context(TRACE, 2), FEEDBACK)

    rendered = json.dumps(context)
    assert FEEDBACK in rendered
    assert ORIGINAL_ANSWER not in rendered
    assert context[-1]["content"] == TRACE[1]["content"] + HINT_TEMPLATE.format(feedback=FEEDBACK)


def test_hint_goes_to_the_last_tool_message_after_a_tool_call():
    context = hint_context(student_context(TOOL_TRACE, 3), FEEDBACK)

    assert context[-1]["role"] == "tool"
    assert context[-1]["content"].endswith(FEEDBACK)
    assert context[0] == TOOL_TRACE[0]


def test_hint_context_leaves_the_trace_untouched():
    before = copy.deepcopy(TRACE)

    hint_context(student_context(TRACE, 2), FEEDBACK)

    assert before == TRACE


def test_rewrite_context_shows_the_original_answer_then_asks_for_a_rewrite():
    context = rewrite_context(student_context(TRACE, 2), TRACE[2], FEEDBACK)

    assert context[:3] == TRACE
    assert context[3]["role"] == "user"
    assert FEEDBACK in context[3]["content"]


@pytest.mark.parametrize(
    ("check", "reply", "passed"),
    [
        ({"kind": "regex", "value": "^Answer:"}, "Answer: Paris.", True),
        ({"kind": "regex", "value": "^Answer:"}, "Paris. Answer: Paris.", False),
        ({"kind": "not_regex", "value": "(?i)sorry"}, "Sorry, no.", False),
        ({"kind": "not_regex", "value": "(?i)sorry"}, "Paris.", True),
        ({"kind": "max_words", "value": 3}, "It is Paris.", True),
        ({"kind": "max_words", "value": 3}, "The capital is Paris.", False),
        ({"kind": "calls_tool", "value": "get_weather"}, TOOL_TRACE[1], True),
        ({"kind": "calls_tool", "value": "get_time"}, TOOL_TRACE[1], False),
        (
            {"kind": "calls_tool", "value": "get_weather"},
            '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
            True,
        ),
    ],
)
def test_checks(check, reply, passed):
    [result] = run_checks(reply, [check])

    assert result.passed is passed
    assert (result.kind, result.value) == (check["kind"], check["value"])


def test_unknown_check_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown check kind"):
        run_checks("Paris.", [{"kind": "sentiment", "value": "happy"}])


def test_select_revisions_drops_failing_duplicate_and_empty_ones():
    candidates = ["Answer: Paris.", "Paris.", "Answer:  Paris. ", "", "Answer: It is Paris."]

    kept = select_revisions(candidates, [{"kind": "regex", "value": "^Answer:"}])

    assert kept == ["Answer: Paris.", "Answer: It is Paris."]


def test_proposals_are_deduplicated_and_marked_with_why_they_fail():
    teacher = ScriptedTeacher(
        [
            _reply("Answer: Paris."),
            _reply("Answer: Paris."),
            _reply("Paris."),
            _reply("Answer: Paris is the capital and", truncated=True),
        ]
    )

    proposals = propose_targets(
        teacher, TRACE, None, FEEDBACK, [{"kind": "regex", "value": "^Answer:"}]
    )

    # Passing first, then the failing ones closest to the original answer first.
    assert proposals == [
        Proposal("Answer: Paris.", {"role": "assistant", "content": "Answer: Paris."}, True),
        Proposal(
            "Answer: Paris is the capital and",
            {"role": "assistant", "content": "Answer: Paris is the capital and"},
            False,
            ("truncated at max_tokens",),
        ),
        Proposal(
            "Paris.",
            {"role": "assistant", "content": "Paris."},
            False,
            ("regex '^Answer:'",),
        ),
    ]


def test_the_teacher_samples_again_until_a_proposal_passes_or_the_budget_is_spent():
    teacher = ScriptedTeacher(
        [_reply("Paris."), _reply("It is Paris."), _reply("Answer: Paris."), _reply("x")]
    )
    checks = [{"kind": "regex", "value": "^Answer:"}]

    proposals = propose_targets(teacher, TRACE, None, FEEDBACK, checks, n=2, budget=8)

    assert len(teacher.seen) == 2  # the second request found one that passes, and it stopped
    assert proposals[0].text == "Answer: Paris."


def test_the_budget_bounds_the_samples_when_none_passes():
    teacher = ScriptedTeacher([_reply(f"Paris {index}.") for index in range(10)])

    proposals = propose_targets(
        teacher, TRACE, None, FEEDBACK, [{"kind": "regex", "value": "^Answer:"}], n=2, budget=6
    )

    assert (len(teacher.seen), len(proposals)) == (3, 6)
    assert not any(proposal.passes_checks for proposal in proposals)


def test_a_long_answers_revisions_may_be_as_long_and_then_some():
    """A 100-word answer is about 130 tokens: its revisions get room for that and more (a fixed
    64 cut every one of them), a short one keeps the floor, and none passes the ceiling."""
    long_answer = " ".join(["Paris is the capital and largest city of France."] * 11)
    short_teacher, long_teacher = ScriptedTeacher([_reply("x")]), ScriptedTeacher([_reply("x")])

    propose_targets(short_teacher, TRACE, None, FEEDBACK, [])
    long_trace = [*TRACE[:2], {"role": "assistant", "content": long_answer}]
    propose_targets(long_teacher, long_trace, None, FEEDBACK, [])

    assert short_teacher.max_tokens == [MIN_REVISION_TOKENS]
    assert 1.5 * 130 < long_teacher.max_tokens[0] < MAX_REVISION_TOKENS
    huge = {"role": "assistant", "content": long_answer * 10}
    assert revision_budget(huge) == MAX_REVISION_TOKENS
    call = {"role": "assistant", "content": None, "tool_calls": TOOL_TRACE[1]["tool_calls"] * 8}
    assert revision_budget(call) > MIN_REVISION_TOKENS  # a call's arguments count too


def test_passing_proposals_closest_to_the_original_come_first():
    teacher = ScriptedTeacher(
        [_reply("Answer: Lyon, no, Paris."), _reply(f"Answer: {ORIGINAL_ANSWER}")]
    )

    proposals = propose_targets(
        teacher, TRACE, None, FEEDBACK, [{"kind": "regex", "value": "^Answer:"}], want=2
    )

    assert [proposal.text for proposal in proposals] == [
        f"Answer: {ORIGINAL_ANSWER}",
        "Answer: Lyon, no, Paris.",
    ]


def test_worked_examples_are_earlier_exchanges_after_the_system_prompt():
    hint = HINT_TEMPLATE.format(feedback=FEEDBACK)
    example = WorkedExample.reply("What is 2 + 2?", "Answer: 4.")

    context = hint_context(student_context(TRACE, 2), FEEDBACK, [example])

    assert context == [
        TRACE[0],
        {"role": "user", "content": "What is 2 + 2?" + hint},
        {"role": "assistant", "content": "Answer: 4."},
        {"role": "user", "content": TRACE[1]["content"] + hint},
    ]


def test_a_worked_example_of_a_tool_call_is_shown_as_the_call_after_its_exchange():
    """A correction that retries a failed call: its example is the exchange from the user's
    question (the failed call and its result included) with the feedback on the tool result,
    then the call itself, not its (empty) words."""
    feedback = "When a tool fails, call it again once."
    failed = copy.deepcopy(TOOL_TRACE[:3])
    failed[2]["content"] = "error: get_weather service unavailable"
    retry = copy.deepcopy(TOOL_TRACE[1])
    example = WorkedExample.ending([TRACE[0], *TRACE[1:3], *failed], retry)
    hint = HINT_TEMPLATE.format(feedback=feedback)

    context = hint_context(student_context(TOOL_TRACE, 3), feedback, [example])

    assert example.exchange == tuple(failed)  # the earlier exchange is left out
    assert context == [
        failed[0],
        failed[1],
        {**failed[2], "content": failed[2]["content"] + hint},
        retry,
        TOOL_TRACE[0],
        TOOL_TRACE[1],
        {**TOOL_TRACE[2], "content": TOOL_TRACE[2]["content"] + hint},
    ]
    assert example.exchange[2]["content"] == "error: get_weather service unavailable"


def test_the_teacher_shown_one_lesson_sees_its_own_prompt():
    example = WorkedExample.reply("What is 2 + 2?", "Answer: 4.")
    context = student_context(TRACE, 2)

    shown = lessons_context(context, [LessonHint(FEEDBACK, (example,))])

    assert shown == hint_context(context, FEEDBACK, [example])


def test_the_teacher_shown_several_lessons_sees_all_their_feedback_and_examples_in_turn():
    first = [WorkedExample.reply(f"Question {n}?", f"First {n}.") for n in range(3)]
    second = [WorkedExample.reply("Other?", "Second.")]
    lessons = [
        LessonHint(" Be brief. ", tuple(first)),
        LessonHint("End with a question.", tuple(second)),
    ]

    shown = lessons_context([{"role": "user", "content": "Hi?"}], lessons, max_examples=3)

    hint = HINT_TEMPLATE.format(feedback="Be brief. End with a question.")
    assert shown[-1] == {"role": "user", "content": "Hi?" + hint}
    answers = [message["content"] for message in shown if message["role"] == "assistant"]
    assert answers == ["First 0.", "Second.", "First 1."]


def test_no_lesson_is_nothing_to_show_the_teacher():
    with pytest.raises(ValueError, match="no lesson"):
        lessons_context([{"role": "user", "content": "Hi?"}], [])


def test_a_context_without_a_user_message_makes_no_worked_example():
    assert WorkedExample.ending([TRACE[0]], TRACE[2]) is None


def test_the_hint_teacher_is_shown_the_worked_examples():
    teacher = ScriptedTeacher([_reply("Answer: Paris.")])
    example = WorkedExample.reply("What is 2 + 2?", "Answer: 4.")

    propose_targets(teacher, TRACE, 2, FEEDBACK, [], examples=[example])

    [seen] = teacher.seen
    assert {"role": "assistant", "content": "Answer: 4."} in seen
    assert seen[-1]["content"].startswith(TRACE[1]["content"])  # the trace's question comes last


@pytest.mark.parametrize(("prompt", "shows_original"), [("hint", False), ("rewrite", True)])
def test_the_teacher_sees_the_original_answer_only_when_asked_to_rewrite(prompt, shows_original):
    teacher = ScriptedTeacher([_reply("Answer: Paris.")])

    propose_targets(teacher, TRACE, 2, FEEDBACK, [], prompt=prompt)

    [seen] = teacher.seen
    assert (ORIGINAL_ANSWER in json.dumps(seen)) is shows_original


def test_vllm_teacher_asks_for_n_choices_in_one_request():
    requests = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(json.loads(request.content))
        choices = [
            {
                "message": {"role": "assistant", "content": "Answer: Paris."},
                "finish_reason": "stop",
            },
            {"message": {"role": "assistant", "content": "Answer: It"}, "finish_reason": "length"},
        ]
        return httpx.Response(200, json={"choices": choices})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    teacher = VllmTeacher("http://vllm.test/v1/", "smol", client)

    samples = teacher.sample(SampleRequest(TRACE[:2], n=2, max_tokens=32, temperature=0.7))

    assert requests == [
        {
            "model": "smol",
            "messages": TRACE[:2],
            "n": 2,
            "max_tokens": 32,
            "temperature": 0.7,
            "seed": 0,
        }
    ]
    assert [sample.truncated for sample in samples] == [False, True]
    assert samples[0].message == {"role": "assistant", "content": "Answer: Paris."}


def test_vllm_teachers_rounds_draw_from_seeds_past_the_last_rounds_choices():
    seeds = []

    def handler(request: httpx.Request) -> httpx.Response:
        seeds.append(json.loads(request.content)["seed"])
        choice = {"message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice]})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    teacher = VllmTeacher("http://vllm.test/v1/", "smol", client, seed=7)

    for n in (4, 2, 4):
        teacher.sample(SampleRequest(TRACE[:2], n=n, max_tokens=32, temperature=0.7))

    # vLLM seeds the i-th choice seed + i: no choice of one round repeats one of another's.
    assert seeds == [7, 11, 13]


def test_transformers_teacher_repeats_its_samples_for_the_same_seed(
    make_tiny_llama, make_tiny_tokenizer
):
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_llama()

    request = SampleRequest(TRACE[:2], n=3, max_tokens=8, temperature=1.0)
    first = TransformersTeacher(model, tokenizer, seed=3).sample(request)
    second = TransformersTeacher(model, tokenizer, seed=3).sample(request)

    assert first == second
    assert len(first) == 3


def test_the_teachers_edit_of_the_original_is_proposed_first_and_wins_where_it_passes():
    checks = [{"kind": "regex", "value": "^Answer:"}]
    samples = [_reply("Answer: The answer to this question is Paris."), _reply("Paris.")]
    edited = _reply(f"Answer: {ORIGINAL_ANSWER}")
    teacher = EditingTeacher(samples, edited)

    proposals = propose_targets(teacher, TRACE, None, FEEDBACK, checks, n=2, edit_original=True)
    without = propose_targets(EditingTeacher(samples, edited), TRACE, None, FEEDBACK, checks, n=2)

    [request] = teacher.edits
    assert request.original == ORIGINAL_ANSWER
    assert request.messages == hint_context(student_context(TRACE, 2), FEEDBACK)
    # It passed, so no sample was needed; it is the target.
    assert teacher.seen == []
    assert [proposal.text for proposal in proposals] == [f"Answer: {ORIGINAL_ANSWER}"]
    assert without[0].text == "Answer: The answer to this question is Paris."


def test_an_edit_that_fails_the_checks_or_cannot_be_made_leaves_the_samples_to_it():
    checks = [{"kind": "regex", "value": "^Answer:"}]
    samples = [_reply("Answer: Paris."), _reply("Paris.")]

    failed = EditingTeacher(samples, _reply(ORIGINAL_ANSWER))
    from_failed = propose_targets(failed, TRACE, None, FEEDBACK, checks, n=2, edit_original=True)
    unable = EditingTeacher(samples, None)
    from_unable = propose_targets(unable, TRACE, None, FEEDBACK, checks, n=2, edit_original=True)
    calling = EditingTeacher(samples, _reply("Answer: x"))
    propose_targets(calling, TOOL_TRACE, 1, FEEDBACK, checks, n=2, edit_original=True)

    assert [p.text for p in from_failed] == ["Answer: Paris.", ORIGINAL_ANSWER, "Paris."]
    assert [p.text for p in from_unable] == ["Answer: Paris.", "Paris."]
    assert calling.edits == []  # a tool call is no text to edit


def test_transformers_teacher_edit_keeping_every_token_begins_with_the_original(
    make_tiny_llama, make_tiny_tokenizer
):
    teacher = TransformersTeacher(make_tiny_llama(), make_tiny_tokenizer())
    original = "the capital of france is paris ."
    messages = hint_context(TRACE[:2], FEEDBACK)

    kept = teacher.edit(EditRequest(messages, original, max_tokens=12, keep_at_least=0.0))
    rewritten = teacher.edit(EditRequest(messages, original, max_tokens=12, keep_at_least=1.01))
    sampled = teacher.sample(SampleRequest(messages, n=1, max_tokens=12, temperature=None))

    assert kept.message["content"].startswith(original)
    assert rewritten == sampled[0]  # nothing kept: the teacher's own greedy answer


def test_vllm_teacher_edits_nothing_where_the_endpoint_will_not_tokenize():
    """A stand-in for an OpenAI-compatible endpoint that is not vLLM (no /tokenize)."""
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(404, json={"error": "not found"})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    teacher = VllmTeacher("http://teacher.test/v1/", "smol", client)

    assert teacher.edit(EditRequest(TRACE[:2], ORIGINAL_ANSWER, max_tokens=32)) is None
    assert asked == ["/tokenize"]
