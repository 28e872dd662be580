"""The forgetting guard's data: the base's answer after a successful tool result in its tool
episodes, and the teacher's answers to the general prompts when it is shown the lessons."""

from training import replay
from training.checks import tool_result_failed
from training.eval_sets import TOOL_REPLAY_EPISODES
from training.replay import base_replay_examples, base_tool_replay_examples, lesson_replay_examples
from training.targets import LessonHint, WorkedExample, lessons_context


def test_each_tool_episode_replays_the_turn_after_a_successful_result_of_an_offered_tool(
    tmp_path, make_tiny_llama, make_tiny_tokenizer
):
    model, tokenizer = make_tiny_llama(), make_tiny_tokenizer()

    examples = base_tool_replay_examples(model, tokenizer, cache_dir=tmp_path)

    assert 0 < len(examples) <= len(TOOL_REPLAY_EPISODES)
    for example in examples:
        *_, call, result = example.context
        [called] = call["tool_calls"]
        assert result["role"] == "tool" and not tool_result_failed(result)
        assert called["function"]["name"] in {tool["function"]["name"] for tool in example.tools}
        assert example.reply["role"] == "assistant"


def test_the_base_answers_are_generated_once_and_read_back(
    tmp_path, make_tiny_llama, make_tiny_tokenizer
):
    tokenizer = make_tiny_tokenizer()
    first = base_tool_replay_examples(make_tiny_llama(seed=0), tokenizer, cache_dir=tmp_path)

    # Another model under the same name and config: the cache answers, not the model.
    again = base_tool_replay_examples(make_tiny_llama(seed=1), tokenizer, cache_dir=tmp_path)

    assert [example.reply for example in again] == [example.reply for example in first]


def test_the_teacher_shown_the_lessons_answers_the_bare_general_prompts(
    tmp_path, make_tiny_llama, make_tiny_tokenizer
):
    model, tokenizer = make_tiny_llama(), make_tiny_tokenizer()
    lessons = [LessonHint("say hello", (WorkedExample.reply("say one", "hello one"),))]
    prompts = ["what is red ?", "say one two three"]

    examples = lesson_replay_examples(
        model, tokenizer, lessons, prompts=prompts, cache_dir=tmp_path
    )
    bare = base_replay_examples(model, tokenizer, prompts=prompts, cache_dir=tmp_path)

    assert [example.context for example in examples] == [
        [{"role": "user", "content": prompt}] for prompt in prompts
    ]
    assert [example.teacher_context for example in examples] == [
        lessons_context(example.context, lessons) for example in examples
    ]
    # The base's own answers are another cache entry, and carry no teacher context.
    assert len(list(tmp_path.glob("replay-*.json"))) == 2
    assert all(example.teacher_context is None for example in bare)


LESSONS = [LessonHint("say hello", (WorkedExample.reply("say one", "hello one"),))]
PROMPTS = ["what is red ?", "say one two three"]


def _replies(examples):
    return [example.reply for example in examples]


def _edits(monkeypatch, model, tokenizer, base_edits, cache_dir=None):
    """The teacher's answers, the base's, then the edits that keep every base token and none."""
    monkeypatch.setattr(replay, "REPLAY_MAX_NEW_TOKENS", replay.LESSON_REPLAY_MAX_NEW_TOKENS)
    teachers = lesson_replay_examples(model, tokenizer, LESSONS, prompts=PROMPTS)
    bases = base_replay_examples(model, tokenizer, prompts=PROMPTS)
    edits = []
    for keep_at_least in (0.0, 1.01):
        monkeypatch.setattr(replay, "LESSON_EDIT_KEEP_AT_LEAST", keep_at_least)
        edits.append(
            lesson_replay_examples(
                model,
                tokenizer,
                LESSONS,
                prompts=PROMPTS,
                base_edits=base_edits,
                cache_dir=cache_dir,
            )
        )
    kept, edited = edits
    return _replies(teachers), _replies(bases), kept, edited


def test_edited_answers_are_the_bases_own_where_the_teacher_finds_its_tokens_likely(
    monkeypatch, make_tiny_llama, make_tiny_tokenizer
):
    model, tokenizer = make_tiny_llama(), make_tiny_tokenizer()

    teachers, bases, kept, edited = _edits(monkeypatch, model, tokenizer, "next_token")

    assert teachers != bases
    assert _replies(kept) == bases
    assert _replies(edited) == teachers
    # Whatever wrote them, the guard's base side is computed under what the teacher saw.
    assert [example.teacher_context for example in kept] == [
        lessons_context(example.context, LESSONS) for example in kept
    ]
    assert all(example.anchor is None for example in [*kept, *edited])


def test_aligned_edits_carry_the_bases_finished_answer_they_edit(
    tmp_path, monkeypatch, make_tiny_llama, make_tiny_tokenizer
):
    model, tokenizer = make_tiny_llama(), make_tiny_tokenizer()

    teachers, bases, kept, edited = _edits(monkeypatch, model, tokenizer, "answer", tmp_path)
    again = lesson_replay_examples(
        model, tokenizer, LESSONS, prompts=PROMPTS, base_edits="answer", cache_dir=tmp_path
    )

    assert teachers != bases
    # Every token of the base's answer kept; past its end the teacher writes alone.
    assert all(
        own["content"] and reply["content"].startswith(own["content"])
        for reply, own in zip(_replies(kept), bases, strict=True)
    )
    assert _replies(edited) == teachers
    # Each carries the base's answer it edits.
    assert [example.anchor for example in [*kept, *edited]] == bases * 2
    assert [example.teacher_context for example in edited] == [
        lessons_context(example.context, LESSONS) for example in edited
    ]
    # Read from the cache: the base's answers, and the edits at each threshold.
    assert again == edited
    assert len(list(tmp_path.glob("replay-*.json"))) == 3
