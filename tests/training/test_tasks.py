"""The Celery tasks end to end on a tiny model saved to disk, against the real database."""

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from reviewapp.learning.models import (
    Adapter,
    DistillationTarget,
    ModelRoute,
    RunStatus,
    TargetState,
    TrainingRun,
)
from reviewapp.learning.retrain import checkpoint_dir
from reviewapp.learning.runs import TransitionRefused, claim, move, start_retrain
from reviewapp.learning.tasks import run_training
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.factories import CAPITAL_CONVERSATION, approve_a_correction
from tests.fake_upstream import free_port
from tests.training.conftest import TINY_MODEL_GATE
from training.config import TrainingConfig
from training.eval_sets import GENERAL_REGRESSION_PROMPTS, REPLAY_PROMPTS
from training.trainer import Example, add_lora, load_base_model, train

CONVERSATION = CAPITAL_CONVERSATION


@pytest.fixture
def approved(project, tiny_base, settings, tmp_path):
    settings.ADAPTERS_DIR = tmp_path / "adapters"
    project.base_model = str(tiny_base)
    project.settings = {
        # Two updates (min_steps 1): a tiny random model fixes nothing in them, and these tests
        # are about the run's mechanics.
        "training": {"epochs": 2, "min_steps": 1, "per_device_batch_size": 2, "max_seq_len": 64},
        "gate": TINY_MODEL_GATE,
        "auto_deploy": False,
    }
    project.save()
    return approve_a_correction(project)


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


def test_the_run_records_the_seconds_each_phase_took_and_its_page_shows_them(
    project, approved, monkeypatch, alice
):
    from django.test import Client

    from training import trainer

    train_for_real = trainer.train

    def slow_train(*args, **kwargs):  # a training phase of known length: at least 0.5 s
        time.sleep(0.5)
        return train_for_real(*args, **kwargs)

    monkeypatch.setattr(trainer, "train", slow_train)
    started = time.monotonic()
    run = start_retrain(project=project)
    run_training(run.pk)
    took = time.monotonic() - started
    run.refresh_from_db()
    phases = run.metrics["phase_seconds"]
    assert set(phases) == {"building", "training", "evaluating"}
    assert phases["training"] >= 0.5
    assert min(phases["building"], phases["evaluating"]) > 0
    assert sum(phases.values()) <= took + 0.1
    client = Client()
    client.force_login(alice)
    page = client.get(f"/p/{project.slug}/runs/{run.pk}/").content.decode()
    assert f"{phases['training']} s training" in page


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
    assert run_training(run.pk) == RunStatus.GATE_FAILED
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
    assert run_training(run.pk) == RunStatus.DEPLOY_FAILED
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
    assert sources.count("general") == len(GENERAL_REGRESSION_PROMPTS)
    [good] = [item for item in metrics["regression"]["items"] if item["source"] == "trace"]
    assert good["trace_id"] == project.traces.get(external_id="went-well").pk
    assert good["drift"] >= 0
    assert metrics["regression"]["mean_drift"] == pytest.approx(good["drift"], abs=1e-4)
    adapter = Adapter.objects.get(run=run)
    lineage = json.loads((Path(adapter.path) / "lineage.json").read_text())
    assert held_out["target_id"] not in lineage["target_ids"]
    assert len(lineage["target_ids"]) == 4


def test_a_run_failed_meanwhile_is_never_overwritten_as_deployed(project, approved):
    run = start_retrain(project=project)
    TrainingRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)

    with pytest.raises(TransitionRefused):
        move(run.pk, source=RunStatus.DEPLOYING, target=RunStatus.DEPLOYED)

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED


def test_a_move_that_is_not_a_transition_is_a_programming_error(project, approved):
    run = start_retrain(project=project)

    with pytest.raises(ValueError, match="queued -> deployed is not a run transition"):
        move(run.pk, source=RunStatus.QUEUED, target=RunStatus.DEPLOYED)


def test_the_data_split_is_fixed_when_the_run_is_created(project, approved):
    run = start_retrain(project=project)

    assert run.data_split["train_target_ids"] == [approved.pk]
    assert run.data_split["held_out_feedback_ids"] == []
    assert run.data_split["replay"]["general_prompts"] == len(REPLAY_PROMPTS)


def test_a_redelivered_run_whose_worker_died_resumes_from_its_checkpoint(
    project, approved, tiny_base
):
    project.settings = {
        **project.settings,
        "training": {**project.settings["training"], "min_steps": 6, "save_every_steps": 2},
    }
    project.save()
    run = start_retrain(project=project)
    config = TrainingConfig.from_json(json.dumps(run.config))
    # The first worker trained 2 of 6 steps, wrote its checkpoint and died.
    model, tokenizer = load_base_model(tiny_base, config)
    model = add_lora(model, config)
    example = Example(approved.student_context, approved.target)
    stop_after_two = iter([False, False, True])
    first = train(
        model,
        tokenizer,
        config,
        examples=[example],
        checkpoint_dir=checkpoint_dir(run),
        should_stop=lambda: next(stop_after_two),
    )
    assert (first.steps, [path.name for path in first.checkpoints]) == (2, ["step-000002"])
    TrainingRun.objects.filter(pk=run.pk).update(
        status=RunStatus.TRAINING,
        attempts=1,
        heartbeat_at=timezone.now() - timedelta(hours=1),
    )

    assert run_training(run.pk) == RunStatus.TRAINED

    run.refresh_from_db()
    assert run.attempts == 2
    assert run.metrics["train"]["steps"] == 6
    # The resumed run's curve starts with the dead worker's two steps, not a fresh start.
    assert run.loss_curve[:2] == pytest.approx([round(loss, 5) for loss in first.loss_curve])


def test_a_live_run_is_not_taken_over_by_a_second_delivery(project, approved):
    run = start_retrain(project=project)
    TrainingRun.objects.filter(pk=run.pk).update(
        status=RunStatus.TRAINING, heartbeat_at=timezone.now(), attempts=1
    )

    assert claim(run.pk) is None


@pytest.mark.parametrize("weight", [0.0, 2.0])
def test_the_forgetting_guard_trains_on_the_replay_set(project, approved, weight):
    project.settings = {
        **project.settings,
        "training": {**project.settings["training"], "base_kl_weight": weight},
    }
    project.save()
    run = start_retrain(project=project)

    run_training(run.pk)

    run.refresh_from_db()
    assert run.metrics["train"]["replay_examples"] > 0
    # The guard's KL is part of each step's loss: with it on, the student's loss includes
    # the replay set's tokens (more tokens per step), with it off only the target's.
    tokens_per_step = run.metrics["train"]["tokens"] / run.metrics["train"]["steps"]
    assert (tokens_per_step > 20) is (weight > 0)


def test_when_the_final_adapter_fails_the_gate_an_earlier_checkpoint_is_tried(project, approved):
    project.settings = {
        **project.settings,
        "training": {**project.settings["training"], "min_steps": 6, "save_every_steps": 2},
        "gate": {"min_fixed_fraction": 1},  # a tiny random model fixes nothing: none passes
    }
    project.save()
    run = start_retrain(project=project)

    assert run_training(run.pk) == RunStatus.GATE_FAILED

    run.refresh_from_db()
    candidates = run.metrics["candidates"]
    assert [(c["step"], c["chosen"], c["passed"]) for c in candidates] == [
        (6, True, False),
        (4, False, False),
    ]
    assert run.metrics["train"]["chosen_step"] == 6  # none passed: the final one is kept
    assert not (checkpoint_dir(run)).exists()  # checkpoints go once the run is evaluated


def test_a_final_adapter_that_passes_the_gate_is_the_only_candidate(project, approved):
    project.settings = {
        **project.settings,
        "training": {**project.settings["training"], "min_steps": 6, "save_every_steps": 2},
    }
    project.save()
    run = start_retrain(project=project)

    assert run_training(run.pk) == RunStatus.TRAINED

    run.refresh_from_db()
    assert [(c["step"], c["chosen"]) for c in run.metrics["candidates"]] == [(6, True)]


def test_with_no_model_server_answering_the_worker_evaluates_and_the_run_page_says_so(
    project, approved, alice, settings
):
    from django.test import Client

    silent = f"http://127.0.0.1:{free_port()}/v1"
    settings.MODEL_SERVERS = [silent]
    project.settings = {**project.settings, "upstreams": [silent]}
    project.save()
    run = start_retrain(project=project)

    assert run_training(run.pk) == RunStatus.TRAINED

    run.refresh_from_db()
    assert run.metrics["evaluated_on"] == {
        "server": "",
        "error": "no model server serving the base model answered",
    }
    client = Client()
    client.force_login(alice)
    page = client.get(f"/p/{project.slug}/runs/{run.pk}/").content.decode()
    assert (
        "Replies generated in the worker (no model server serving the base model answered)" in page
    )
