"""The gate on the real bundled SmolLM2-135M: an adapter that learned one canned reply for every
question has forgotten facts it was never asked about, and the gate keeps it from traffic."""

import pytest

from reviewapp.learning.models import (
    Adapter,
    DistillationTarget,
    ModelRoute,
    RunStatus,
    TargetState,
)
from reviewapp.learning.runs import start_retrain
from reviewapp.learning.tasks import run_training
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

QUESTIONS = [
    "What is the capital of Japan?", "How many legs does a spider have?", "What color is grass?",
    "Who wrote Hamlet?", "What is the largest ocean?", "What do bees make?",
    "Which planet is red?", "What animal says moo?", "What is frozen water called?",
    "How many sides does a triangle have?", "What gas do we breathe in?",
    "What is the opposite of up?",
]  # fmt: skip
CANNED = "Answer: I am happy to help with that."


def test_an_adapter_that_forgot_facts_is_refused_and_routing_is_unchanged(
    project, tmp_path, settings
):
    settings.ADAPTERS_DIR = tmp_path / "adapters"
    project.settings = {
        # A rate that overwrites quickly, no forgetting guard and no earlier candidate: the
        # failure the gate must catch, made fast.
        "training": {
            "learning_rate": 2e-3,
            "epochs": 4,
            "base_kl_weight": 0.0,
            "gate_candidates": 1,
        },
        "auto_deploy": True,
    }
    project.save()
    ModelRoute.objects.create(project=project, primary="")
    for number, question in enumerate(QUESTIONS):
        messages = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "Let me think."},
        ]
        ingest_traces(
            project=project, raw_items=[{"external_id": f"q{number}", "messages": messages}]
        )
        feedback, _ = record_feedback(
            trace=project.traces.get(external_id=f"q{number}"),
            text="Always begin your answer with 'Answer:'.",
            turn=1,
            checks=[{"kind": "regex", "value": "^Answer:"}],
            correction={"role": "assistant", "content": CANNED},
        )
        DistillationTarget.objects.create(
            feedback=feedback,
            turn=1,
            source="correction",
            student_context=messages[:1],
            original=messages[1],
            target={"role": "assistant", "content": CANNED},
            state=TargetState.APPROVED,
        )

    run = start_retrain(project=project)
    assert run_training(run.pk) == RunStatus.GATE_FAILED
    run.refresh_from_db()
    regression = run.metrics["regression"]
    print(f"\n{run.error}; regression: {regression['summary']}")
    assert run.status == RunStatus.GATE_FAILED
    assert run.metrics["feedback_items"]["fixed"] >= len(QUESTIONS) // 2  # it did learn "Answer:"
    assert regression["summary"]["regressed"] >= 2
    assert "regression prompt(s) answered right by the serving model and wrong after" in run.error
    broken = [item for item in regression["items"] if item["status"] == "regressed"]
    assert all(item["source"] == "general" and item["before"]["passed"] for item in broken)
    # The adapter is kept for inspection, but nothing routes to it.
    assert Adapter.objects.filter(run=run).exists()
    assert ModelRoute.objects.get(project=project).primary == ""
