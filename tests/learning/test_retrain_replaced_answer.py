"""An sft Retrain hands the trainer the answer each target replaced (the preference term's
pair): a correction's and a teacher revision's `original`, unless it is the target itself; and
the lesson each teaches, by which the job keeps the pair or not (tests/training/test_job.py)."""

import pytest

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.retrain import _training_job
from reviewapp.learning.runs import start_retrain
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace

ORIGINAL = {"role": "assistant", "content": "It is very cold, very windy."}


def _trace(project, external_id: str) -> Trace:
    question = {"role": "user", "content": f"Weather {external_id}?"}
    ingest_traces(
        project=project, raw_items=[{"external_id": external_id, "messages": [question, ORIGINAL]}]
    )
    return Trace.objects.get(project=project, external_id=external_id)


def _approve(project, external_id: str, *, source: str, original: dict | None, target: dict):
    trace = _trace(project, external_id)
    feedback, _ = record_feedback(trace=trace, text="Do not use the word 'very'.", turn=1)
    DistillationTarget.objects.create(
        feedback=feedback,
        turn=1,
        source=source,
        student_context=trace.body_json()["messages"][:1],
        original=original,
        target=target,
        state=TargetState.APPROVED,
    )


@pytest.mark.django_db
def test_each_sft_example_carries_the_answer_its_target_replaced(project):
    corrected = {"role": "assistant", "content": "It is cold, windy."}
    revised = {"role": "assistant", "content": "Cold and windy."}
    _approve(project, "correction", source="correction", original=ORIGINAL, target=corrected)
    _approve(project, "revision", source="hint", original=ORIGINAL, target=revised)
    _approve(project, "unchanged", source="hint", original=ORIGINAL, target=ORIGINAL)
    _approve(project, "no-original", source="correction", original=None, target=corrected)
    run = start_retrain(project=project)

    job = _training_job(run)

    pairs = {example.context[0]["content"]: example.rejected for example in job.examples}
    assert pairs == {
        "Weather correction?": ORIGINAL,
        "Weather revision?": ORIGINAL,
        "Weather unchanged?": None,
        "Weather no-original?": None,
    }
    lessons = {example.lesson for example in job.examples}
    assert lessons == {item["lesson"] for item in job.feedback_items}
    assert lessons == {"Do not use the word 'very'."}
