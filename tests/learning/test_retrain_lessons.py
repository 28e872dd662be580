"""A Retrain hands the job its lessons as the teacher is shown them (the guard's reference on
general prompts with `guard_reference` "lessons"): one per feedback text trained on turns served
without tools, oldest first, its corrections first among its worked examples."""

import pytest

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.retrain import _training_job
from reviewapp.learning.runs import start_retrain
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace

BRIEF = "Keep it brief."
QUESTION_AT_END = "End with a question."
CALCULATOR = "Use the calculator."
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]


def _approve(project, external_id: str, text: str, *, source: str, answer: str, tools=None):
    question = {"role": "user", "content": f"Question {external_id}?"}
    original = {"role": "assistant", "content": "A long answer."}
    body = {"external_id": external_id, "messages": [question, original]}
    if tools:
        body["tools"] = tools
    ingest_traces(project=project, raw_items=[body])
    trace = Trace.objects.get(project=project, external_id=external_id)
    feedback, _ = record_feedback(trace=trace, text=text, turn=1)
    DistillationTarget.objects.create(
        feedback=feedback,
        turn=1,
        source=source,
        student_context=[question],
        original=original,
        target={"role": "assistant", "content": answer},
        state=TargetState.APPROVED,
    )


@pytest.mark.django_db
def test_each_lesson_on_text_turns_is_handed_over_with_its_targets_as_worked_examples(project):
    _approve(project, "b1", BRIEF, source="hint", answer="Short.")
    _approve(project, "q1", QUESTION_AT_END, source="hint", answer="Yes. Why?")
    _approve(project, "b2", BRIEF, source="correction", answer="Brief.")
    _approve(project, "c1", CALCULATOR, source="correction", answer="2", tools=TOOLS)
    run = start_retrain(project=project)

    job = _training_job(run)

    assert [lesson.feedback for lesson in job.lessons] == [BRIEF, QUESTION_AT_END]
    brief, question = job.lessons
    assert [example.answer["content"] for example in brief.examples] == ["Brief.", "Short."]
    assert brief.examples[0].exchange == ({"role": "user", "content": "Question b2?"},)
    assert [example.answer["content"] for example in question.examples] == ["Yes. Why?"]
