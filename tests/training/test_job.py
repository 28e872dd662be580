"""run_job, the one entry point of a training job: plain data in, an outcome out, the caller
told of phases and progress and asked whether to stop. A tiny random model saved to disk, the
evaluation answered in this process; the callbacks are plain recorders."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from training import trainer
from training.adapters import adapter_checksum
from training.config import TrainingConfig
from training.eval_sets import GENERAL_REGRESSION_PROMPTS
from training.evaluation import SERVING_ADAPTER
from training.gate import GateThresholds
from training.job import (
    Progress,
    ServingAdapter,
    TrainingJob,
    followed_lessons,
    lessons_to_learn,
    preference_pairs_kept,
    run_job,
)
from training.targets import LessonHint, hint_context
from training.trainer import Example, adapter_weights

QUESTIONS = ["what is the capital of france ?", "what is the capital of italy ?", "say hello"]
CONFIG = TrainingConfig(
    lora_r=4,
    lora_alpha=8,
    learning_rate=1e-2,
    epochs=2,
    min_steps=6,
    per_device_batch_size=2,
    save_every_steps=2,
    max_seq_len=64,
)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class Recorder:
    """Callbacks that keep what they hear; `stop_at` says which question of should_stop (in
    a phase) answers True."""

    def __init__(self, stop_at: tuple[str, int] | None = None) -> None:
        self.stop_at = stop_at
        self.phases: list[str] = []
        self.progress: list[Progress] = []
        self.stop_questions: list[str] = []
        self.names_asked = 0

    def on_phase(self, phase: str) -> None:
        self.phases.append(phase)

    def on_progress(self, progress: Progress) -> None:
        self.progress.append(dataclasses.replace(progress, loss_curve=list(progress.loss_curve)))

    def should_stop(self) -> bool:
        phase = self.phases[-1]
        self.stop_questions.append(phase)
        return self.stop_at == (phase, self.stop_questions.count(phase))

    def adapter_name(self) -> str:
        self.names_asked += 1
        return f"acme-v{self.names_asked}"


@pytest.fixture
def make_job(tmp_path, make_tiny_llama, make_tiny_tokenizer):
    base = tmp_path / "tiny-base"
    make_tiny_llama().save_pretrained(base)
    make_tiny_tokenizer().save_pretrained(base)

    def make(**changes) -> TrainingJob:
        job = TrainingJob(
            config=CONFIG,
            base_model=str(base),
            model_cache_dir=tmp_path / "cache",
            checkpoint_dir=tmp_path / "checkpoints",
            adapter_root=tmp_path / "adapters",
            thresholds=GateThresholds(min_fixed_fraction=0),
            examples=[
                Example(_user(q), {"role": "assistant", "content": f"answer : {q}"})
                for q in QUESTIONS
            ],
            feedback_items=[
                {
                    "feedback_id": 7,
                    "context": _user(QUESTIONS[0]),
                    # Not what the examples teach: the tiny model fails it before and after.
                    "teacher_context": hint_context(_user(QUESTIONS[0]), "say paris"),
                    "checks": [{"kind": "regex", "value": "^paris"}],
                }
            ],
            target_ids=[11, 12, 13],
            lineage={"run_id": 5},
        )
        return dataclasses.replace(job, **changes)

    return make


def test_a_job_trains_evaluates_and_writes_the_chosen_adapter(make_job, tmp_path):
    callbacks = Recorder()

    outcome = run_job(make_job(), callbacks)

    assert callbacks.phases == ["training", "evaluating"]
    assert [progress.step for progress in callbacks.progress] == [1, 2, 3, 4, 5, 6]
    assert {progress.total_steps for progress in callbacks.progress} == {6}
    assert callbacks.progress[-1].loss_curve == outcome.loss_curve
    assert not outcome.stopped
    assert outcome.chosen == next(c for c in outcome.metrics["candidates"] if c["chosen"])
    assert outcome.chosen["step"] == outcome.metrics["train"]["chosen_step"] == 6
    assert outcome.metrics["train"]["targets"] == 3
    assert [row["feedback_id"] for row in outcome.metrics["items"]] == [7]
    regression = outcome.metrics["regression"]["items"]
    assert [row["source"] for row in regression] == ["general"] * len(GENERAL_REGRESSION_PROMPTS)
    assert outcome.metrics["evaluated_on"]["server"] == ""  # no server listed: in process
    assert outcome.adapter.path == tmp_path / "adapters" / "acme-v1"
    assert outcome.adapter.checksum == adapter_checksum(outcome.adapter.path)
    lineage = json.loads((outcome.adapter.path / "lineage.json").read_text())
    assert (lineage["target_ids"], lineage["run_id"]) == ([11, 12, 13], 5)
    assert not (tmp_path / "checkpoints").exists()  # the adapter holds what they were for


def test_a_stop_while_training_ends_the_job_before_its_evaluation(make_job, tmp_path):
    callbacks = Recorder(stop_at=("training", 3))

    outcome = run_job(make_job(), callbacks)

    assert outcome.stopped
    assert callbacks.phases == ["training"]
    assert len(outcome.loss_curve) == 2
    assert (outcome.chosen, outcome.adapter, callbacks.names_asked) == (None, None, 0)
    assert not (tmp_path / "adapters").exists()


@pytest.mark.parametrize("question", [1, 2, 3])
def test_a_stop_while_evaluating_writes_no_adapter(make_job, tmp_path, question):
    """Asked before each candidate and before writing: the gate refuses every candidate here,
    so the final one and one checkpoint are evaluated (questions 1, 2), then it writes (3)."""
    job = make_job(thresholds=GateThresholds(min_fixed_fraction=1))
    callbacks = Recorder(stop_at=("evaluating", question))

    outcome = run_job(job, callbacks)

    assert outcome.stopped
    assert callbacks.stop_questions.count("evaluating") == question
    assert (outcome.adapter, callbacks.names_asked) == (None, 0)
    assert not (tmp_path / "adapters").exists()


def test_a_gate_refusal_still_writes_the_final_adapter_with_the_reason(make_job):
    job = make_job(thresholds=GateThresholds(min_fixed_fraction=1))

    outcome = run_job(job, Recorder())

    assert [(c["step"], c["chosen"]) for c in outcome.metrics["candidates"]] == [
        (6, True),
        (4, False),
    ]
    assert outcome.chosen["passed"] is False
    assert "the gate asks for 100%" in outcome.chosen["reason"]
    assert outcome.adapter is not None  # kept for inspection; the caller does not deploy it


def test_a_job_resumes_from_the_checkpoint_an_earlier_attempt_left(make_job):
    job = make_job()
    first = run_job(job, Recorder(stop_at=("training", 3)))  # stopped after step 2's checkpoint
    callbacks = Recorder()

    resumed = run_job(job, callbacks)

    assert [progress.step for progress in callbacks.progress] == [3, 4, 5, 6]
    assert callbacks.progress[0].loss_curve[:2] == first.loss_curve
    assert resumed.loss_curve[:2] == first.loss_curve
    assert resumed.metrics["train"]["steps"] == 6


def test_a_phase_the_caller_refuses_ends_the_job_with_its_error(make_job):
    class Refused(Exception):
        pass

    class RefusesTraining(Recorder):
        def on_phase(self, phase: str) -> None:
            raise Refused(phase)

    callbacks = RefusesTraining()

    with pytest.raises(Refused, match="training"):
        run_job(make_job(), callbacks)

    assert callbacks.progress == []


def test_replay_examples_bounds_the_forgetting_guards_data_the_jobs_own_first(make_job):
    replay = [Example(_user(q), {"role": "assistant", "content": q}) for q in QUESTIONS]
    job = make_job(config=dataclasses.replace(CONFIG, replay_examples=2), replay=replay)

    outcome = run_job(job, Recorder())

    assert outcome.metrics["train"]["replay_examples"] == 2


def test_a_job_on_turns_offered_tools_also_replays_the_bases_answers_after_a_tool_result(
    make_job, tmp_path
):
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "2 + 2"}'}}  # fmt: skip
    examples = [
        Example(_user(q), {"role": "assistant", "content": None, "tool_calls": [call]}, tools)
        for q in QUESTIONS
    ]

    with_tools = run_job(make_job(examples=examples), Recorder())
    without = run_job(make_job(adapter_root=tmp_path / "other"), Recorder())

    assert with_tools.metrics["train"]["tool_replay_examples"] > 0
    assert without.metrics["train"]["tool_replay_examples"] == 0


@pytest.fixture
def replayed(monkeypatch) -> list:
    """The replay examples the job hands the trainer, caught by wrapping trainer.train."""
    caught: list = []
    real_train = trainer.train

    def train(*args, replay, **kwargs):
        caught.extend(replay)
        return real_train(*args, replay=replay, **kwargs)

    monkeypatch.setattr(trainer, "train", train)
    return caught


@pytest.mark.parametrize(
    "reference", ["lessons", "lesson_changes", "lesson_edits", "aligned_edits"]
)
def test_with_the_lessons_as_the_guards_reference_the_teacher_answers_the_general_prompts(
    make_job, tmp_path, replayed, reference
):
    lessons = [LessonHint("say hello")]
    taught = dataclasses.replace(CONFIG, guard_reference=reference)

    with_lessons = run_job(make_job(config=taught, lessons=lessons), Recorder())
    shown = [example.teacher_context is not None for example in replayed]
    anchored = [example.anchor is not None for example in replayed]
    base = run_job(make_job(lessons=lessons, adapter_root=tmp_path / "other"), Recorder())

    assert with_lessons.metrics["train"]["replay_lessons"] == ["say hello"]
    assert shown and all(shown)
    # Only the base's finished answers, edited, carry the answer they edit.
    assert all(anchored) if reference == "aligned_edits" else not any(anchored)
    assert base.metrics["train"]["replay_lessons"] == []


def test_with_both_as_the_guards_reference_the_base_and_the_teacher_take_turns(make_job, replayed):
    both = dataclasses.replace(CONFIG, guard_reference="both", replay_examples=6)

    outcome = run_job(make_job(config=both, lessons=[LessonHint("say hello")]), Recorder())

    assert outcome.metrics["train"]["replay_lessons"] == ["say hello"]
    # Every other general example is the teacher's (it carries the context the teacher saw).
    shown = [example.teacher_context is not None for example in replayed]
    assert shown == [False, True] * 3


def test_the_jobs_regression_items_are_evaluated_besides_the_general_facts(make_job):
    good_trace = {
        "source": "trace",
        "trace_id": 3,
        "context": _user(QUESTIONS[1]),
        "reference": {"role": "assistant", "content": "rome"},
    }

    outcome = run_job(make_job(regression_items=[good_trace]), Recorder())

    [row] = [r for r in outcome.metrics["regression"]["items"] if r["source"] == "trace"]
    assert row["trace_id"] == 3
    assert outcome.metrics["regression"]["mean_drift"] == pytest.approx(row["drift"], abs=1e-4)


def test_the_serving_adapter_answers_the_before_side_and_is_not_written_with_the_candidate(
    make_job, tmp_path
):
    """The same job twice: the second candidate is the first adapter again (same seed, same
    data), so judged against it as the serving side, no item moves either way."""
    first = run_job(make_job(), Recorder())
    serving = ServingAdapter(name="acme-v1", version=1, path=first.adapter.path)
    from_base = dataclasses.replace(CONFIG, start_from="base")
    job = make_job(adapter_root=tmp_path / "second", serving_adapter=serving, config=from_base)

    second = run_job(job, Recorder())

    assert second.metrics["serving"] == {"name": "acme-v1", "version": 1}
    assert first.metrics["serving"] is None
    rows = [*second.metrics["items"], *second.metrics["regression"]["items"]]
    assert {row["status"] for row in rows} <= {"still passing", "still failing"}
    assert [row["before"]["reply"] for row in rows] == [row["after"]["reply"] for row in rows]
    # Against the base, the first adapter's replies differed somewhere.
    first_rows = [*first.metrics["items"], *first.metrics["regression"]["items"]]
    assert any(row["before"]["reply"] != row["after"]["reply"] for row in first_rows)
    assert sorted(path.name for path in second.adapter.path.iterdir()) == sorted(
        path.name for path in first.adapter.path.iterdir()
    )


@pytest.fixture
def weights_at_training_start(monkeypatch):
    """The candidate's adapter weights as training begins, caught by wrapping trainer.train."""
    caught: list[dict] = []
    real_train = trainer.train

    def train(model, *args, **kwargs):
        caught.append(adapter_weights(model))
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(trainer, "train", train)
    return caught


@pytest.mark.parametrize(
    ("start_from", "lora_r", "started_from"),
    [
        ("serving", 4, "acme-v1"),
        ("base", 4, "base"),
        ("serving", 8, "base (the serving adapter acme-v1 has another LoRA shape)"),
    ],
)
def test_a_retrain_starts_from_the_serving_adapter_where_its_config_says_and_the_shape_fits(
    make_job, tmp_path, weights_at_training_start, start_from, lora_r, started_from
):
    first = run_job(make_job(), Recorder())
    serving = ServingAdapter(name="acme-v1", version=1, path=first.adapter.path)
    config = dataclasses.replace(
        CONFIG, start_from=start_from, lora_r=lora_r, lora_alpha=2 * lora_r
    )
    job = make_job(adapter_root=tmp_path / "second", serving_adapter=serving, config=config)

    second = run_job(job, Recorder())

    assert second.metrics["train"]["started_from"] == started_from
    assert first.metrics["train"]["started_from"] == "base"  # nothing served yet
    served = load_file(first.adapter.path / "adapter_model.safetensors")
    at_start = weights_at_training_start[-1]
    if started_from == "acme-v1":
        assert all(torch.equal(at_start[name], served[name]) for name in served)
    else:  # a fresh adapter: LoRA's B matrices start at zero
        assert all(not tensor.any() for name, tensor in at_start.items() if "lora_B" in name)


@pytest.fixture
def guard_adapters(monkeypatch):
    """The adapter each trainer.train call's guard was given, caught by wrapping it."""
    caught: list[str | None] = []
    real_train = trainer.train

    def train(model, *args, guard_adapter=None, **kwargs):
        caught.append(guard_adapter)
        return real_train(model, *args, guard_adapter=guard_adapter, **kwargs)

    monkeypatch.setattr(trainer, "train", train)
    return caught


@pytest.mark.parametrize(
    ("start_from", "guard_keeps", "guarded_by"),
    [("serving", "serving", "serving"), ("serving", "base", None), ("base", "serving", None)],
)
def test_the_guard_keeps_the_serving_adapter_where_the_run_starts_from_it(
    make_job, tmp_path, guard_adapters, start_from, guard_keeps, guarded_by
):
    """Held to the adapter it started from, a retrain keeps what serves; a run from the base
    has nothing else to be held to. The candidate written does not hold that adapter."""
    first = run_job(make_job(), Recorder())
    serving = ServingAdapter(name="acme-v1", version=1, path=first.adapter.path)
    config = dataclasses.replace(CONFIG, start_from=start_from, guard_keeps=guard_keeps)
    job = make_job(adapter_root=tmp_path / "second", serving_adapter=serving, config=config)

    second = run_job(job, Recorder())

    assert guard_adapters == [None, guarded_by]  # the first run: no adapter serves yet
    assert second.metrics["train"]["guarded_by"] == ("acme-v1" if guarded_by else "base")
    assert second.metrics["serving"] == {"name": "acme-v1", "version": 1}
    assert not (second.adapter.path / SERVING_ADAPTER).exists()
    assert sorted(path.name for path in second.adapter.path.iterdir()) == sorted(
        path.name for path in first.adapter.path.iterdir()
    )


def test_each_lesson_new_to_the_starting_weights_gets_min_steps_of_training(make_job, tmp_path):
    """3 examples, min_steps 6: one lesson trains 6 updates; two lessons the serving adapter
    never trained on, 12; from the serving adapter, one it learned already adds none."""
    item = make_job().feedback_items[0]
    lessons = [
        {**item, "feedback_id": 7, "lesson": "Say paris."},
        {**item, "feedback_id": 8, "lesson": "say  PARIS."},  # the same lesson
        {**item, "feedback_id": 9, "lesson": "Say rome.", "learned_by_serving": True},
        {**item, "feedback_id": 10, "lesson": "Say madrid.", "held_out": True},  # not trained
    ]

    one = run_job(make_job(), Recorder())
    two = run_job(make_job(adapter_root=tmp_path / "second", feedback_items=lessons), Recorder())

    assert one.metrics["train"]["steps"] == 6
    # From the base (nothing serves): "say paris." and "say rome." are both to learn.
    assert two.metrics["train"]["new_lessons"] == ["say paris.", "say rome."]
    assert two.metrics["train"]["steps"] == 12
    assert lessons_to_learn(lessons, from_serving=True) == {"say paris."}


# The preference term's pairs, kept per lesson


NEVER_VERY = "Do not use the word 'very'."
BEGIN_WITH_ANSWER = "Begin with 'Answer:'."


def _lesson_item(lesson: str, check: dict, original: str) -> dict:
    return {
        "context": _user("why is the sky blue ?"),
        "checks": [check],
        "original": {"role": "assistant", "content": original},
        "lesson": lesson,
    }


LESSON_ITEMS = [
    # The model follows "never 'very'" on 2 of 3 items already, "Answer:" on 1 of 3.
    *(
        _lesson_item(NEVER_VERY, {"kind": "not_regex", "value": r"\bvery\b"}, original)
        for original in ("It scatters light.", "It is very blue.", "Rayleigh scattering.")
    ),
    *(
        _lesson_item(BEGIN_WITH_ANSWER, {"kind": "regex", "value": "^Answer:"}, original)
        for original in ("Answer: scattering.", "It scatters light.", "Because of the air.")
    ),
    # Without checks an item says nothing: it does not make "Answer:" followed.
    *({**_lesson_item(BEGIN_WITH_ANSWER, {}, "Answer: air."), "checks": []} for _ in range(3)),
]


def _paired(lesson: str | None, question: str) -> Example:
    return Example(
        _user(question),
        {"role": "assistant", "content": f"Answer : {question}"},
        rejected={"role": "assistant", "content": f"it is very much {question}"},
        lesson=lesson,
    )


def test_only_a_lesson_the_model_mostly_follows_keeps_its_preference_pairs():
    examples = [
        _paired(NEVER_VERY, QUESTIONS[0]),
        _paired(BEGIN_WITH_ANSWER, QUESTIONS[1]),
        _paired(None, QUESTIONS[2]),
    ]

    followed = preference_pairs_kept(examples, LESSON_ITEMS, CONFIG)
    everyone = preference_pairs_kept(
        examples, LESSON_ITEMS, dataclasses.replace(CONFIG, preference_lessons="all")
    )

    assert followed_lessons(LESSON_ITEMS) == {NEVER_VERY}
    assert [example.rejected is not None for example in followed] == [True, False, False]
    assert [example.reply for example in followed] == [example.reply for example in examples]
    assert everyone == examples


def test_the_job_trains_and_reports_the_pairs_it_kept(make_job, tmp_path, monkeypatch):
    handed: list[Example] = []
    real_train = trainer.train

    def train(*args, examples, **kwargs):
        handed.extend(examples)
        return real_train(*args, examples=examples, **kwargs)

    monkeypatch.setattr(trainer, "train", train)
    examples = [_paired(NEVER_VERY, QUESTIONS[0]), _paired(BEGIN_WITH_ANSWER, QUESTIONS[1])]

    outcome = run_job(make_job(examples=examples, feedback_items=LESSON_ITEMS), Recorder())
    off = dataclasses.replace(CONFIG, preference_weight=0.0)
    without = run_job(
        make_job(examples=examples, feedback_items=LESSON_ITEMS, config=off,
                 adapter_root=tmp_path / "other"),
        Recorder(),
    )  # fmt: skip

    assert [example.rejected is not None for example in handed[:2]] == [True, False]
    assert outcome.metrics["train"]["preference_pairs"] == 1
    assert without.metrics["train"]["preference_pairs"] == 0
