"""The Celery tasks end to end on a tiny model saved to disk, against the real database."""

import json
from pathlib import Path

import pytest

from reviewapp.models import (
    Adapter,
    DistillationTarget,
    ModelRoute,
    RunStatus,
    TargetState,
    TrainingRun,
)
from reviewapp.services.feedback import record_feedback
from reviewapp.services.ingest import ingest_traces
from reviewapp.learning.runs import start_retrain
from tests.fake_upstream import free_port
from reviewapp.learning.tasks import run_training

CONVERSATION = [
    {"role": "user", "content": "what is the capital of france ?"},
    {"role": "assistant", "content": "rome"},
]


@pytest.fixture
def tiny_base(tmp_path, make_tiny_llama, make_tiny_tokenizer):
    directory = tmp_path / "tiny-base"
    make_tiny_llama().save_pretrained(directory)
    make_tiny_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture
def approved(project, tiny_base, settings, tmp_path):
    settings.ADAPTERS_DIR = tmp_path / "adapters"
    project.base_model = str(tiny_base)
    project.settings = {
        "training": {"epochs": 2, "per_device_batch_size": 2, "max_seq_len": 64},
        # A tiny random model fixes nothing; these tests are about the run's mechanics.
        "gate": {"min_fixed_fraction": 0},
        "auto_deploy": False,
    }
    project.save()
    ingest_traces(project=project, raw_items=[{"external_id": "t", "messages": CONVERSATION}])
    feedback, _ = record_feedback(
        trace=project.traces.get(),
        text="say paris",
        turn=1,
        checks=[{"kind": "regex", "value": "^paris"}],
    )
    return DistillationTarget.objects.create(
        feedback=feedback,
        turn=1,
        source="correction",
        student_context=CONVERSATION[:1],
        target={"role": "assistant", "content": "paris"},
        state=TargetState.APPROVED,
    )


def test_a_run_trains_writes_an_immutable_adapter_and_records_progress(project, approved):
    run = start_retrain(project=project)
    assert run_training(run.pk) == "trained"
    run.refresh_from_db()
    assert run.status == RunStatus.TRAINED
    assert run.progress["step"] == run.progress["total_steps"] > 0
    assert len(run.loss_curve) == run.progress["total_steps"]
    adapter = Adapter.objects.get(run=run)
    assert adapter.name == "acme-v1"
    files = {path.name for path in Path(adapter.path).iterdir()}
    assert {"adapter_model.safetensors", "training_config.json", "lineage.json"} <= files
    assert set(run.metrics["feedback_items"]) >= {"fixed", "still failing", "regressed"}


def test_a_second_delivery_of_the_same_run_does_nothing(project, approved):
    run = start_retrain(project=project)
    run_training(run.pk)
    assert run_training(run.pk) == "not claimed"
    assert Adapter.objects.count() == 1


def test_a_cancel_request_stops_the_run(project, approved):
    run = start_retrain(project=project)
    TrainingRun.objects.filter(pk=run.pk).update(cancel_requested=True)
    assert run_training(run.pk) == "cancelled"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert not Adapter.objects.exists()


def test_a_broken_base_model_fails_the_run_with_the_reason(project, approved):
    project.base_model = "no-such-model"
    project.save()
    run = start_retrain(project=project)
    assert run_training(run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "no-such-model" in run.error
    assert "Traceback" in run.log


def test_a_gate_the_adapter_does_not_pass_stops_the_deploy(project, approved):
    project.settings = {**project.settings, "gate": {"min_fixed_fraction": 1}}
    project.save()
    run = start_retrain(project=project)
    assert run_training(run.pk) == "gate failed"
    run.refresh_from_db()
    assert run.status == RunStatus.GATE_FAILED
    assert "the gate asks for 100%" in run.error
    assert not ModelRoute.objects.exists()


def test_a_model_server_that_is_down_ends_the_run_deploy_failed_with_routing_unchanged(
    project, approved
):
    project.upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    project.settings = {**project.settings, "auto_deploy": True}
    project.save()
    ModelRoute.objects.create(project=project, primary="acme-v0")
    run = start_retrain(project=project)
    assert run_training(run.pk) == "deploy failed"
    run.refresh_from_db()
    assert run.status == RunStatus.DEPLOY_FAILED
    assert "routing unchanged" in run.error
    assert ModelRoute.objects.get(project=project).primary == "acme-v0"


def test_the_gate_sees_held_out_feedback_regression_prompts_and_good_traces(project, approved):
    """Five feedback items of one kind: one is held out (evaluated, not trained on); a trace that
    went well becomes a regression item whose drift from the base is measured."""
    for number in range(4):
        # Other questions: the same context and target twice would be one training example.
        conversation = [
            {"role": "user", "content": f"what is the capital of france {'?' * (number + 2)}"},
            CONVERSATION[1],
        ]
        ingest_traces(
            project=project,
            raw_items=[{"external_id": f"more-{number}", "messages": conversation}],
        )
        feedback, _ = record_feedback(
            trace=project.traces.get(external_id=f"more-{number}"),
            text="say paris",
            turn=1,
            checks=[{"kind": "regex", "value": "^paris"}],
        )
        DistillationTarget.objects.create(
            feedback=feedback,
            turn=1,
            source="hint",
            student_context=conversation[:1],
            target={"role": "assistant", "content": "paris"},
            state=TargetState.APPROVED,
        )
    ingest_traces(
        project=project,
        raw_items=[
            {
                "external_id": "went-well",
                "messages": [
                    {"role": "user", "content": "what is the capital of italy ?"},
                    {"role": "assistant", "content": "rome"},
                ],
                "outcome": {"success": True},
            }
        ],
    )
    run = start_retrain(project=project)
    assert run_training(run.pk) == "trained"
    run.refresh_from_db()
    metrics = run.metrics
    assert metrics["train"]["targets"] == 4
    [held_out] = metrics["held_out"]["items"]
    assert held_out["status"] in ("fixed", "still failing", "regressed", "still passing")
    assert held_out["feedback_id"] not in {item["feedback_id"] for item in metrics["items"]}
    assert len(metrics["items"]) == 4  # one row per trained feedback item, not per target
    sources = [item["source"] for item in metrics["regression"]["items"]]
    assert sources.count("general") == 8
    [good] = [item for item in metrics["regression"]["items"] if item["source"] == "trace"]
    assert good["trace_id"] == project.traces.get(external_id="went-well").pk
    assert good["drift"] >= 0
    assert metrics["regression"]["mean_drift"] == pytest.approx(good["drift"], abs=1e-4)
    adapter = Adapter.objects.get(run=run)
    lineage = json.loads((Path(adapter.path) / "lineage.json").read_text())
    assert held_out["target_id"] not in lineage["target_ids"]
    assert len(lineage["target_ids"]) == 4
