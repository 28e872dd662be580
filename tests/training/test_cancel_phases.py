"""Cancel is honoured in every phase of a run: building, training, evaluating, deploying. The
run ends `cancelled` and the project's route is as it was. The worker runs for real on a tiny
model against a FAKE model server (tests/fake_upstream.py); the cancel is the run page's own
service call (request_cancel), made from inside the phase under test."""

import pytest

from reviewapp.learning import deploy as learning_deploy
from reviewapp.learning.deploy import deploy_adapter
from reviewapp.learning.models import (
    Adapter,
    ModelRoute,
    RunStatus,
    TrainingRun,
)
from reviewapp.learning.retrain import checkpoint_dir
from reviewapp.learning.runs import TransitionRefused, request_cancel, start_retrain
from reviewapp.learning.tasks import run_training
from tests.factories import approve_a_correction
from tests.fake_upstream import FakeUpstream
from tests.training.conftest import TINY_MODEL_GATE
from training import trainer
from training.repliers import InProcessReplier

TRAINING = {"epochs": 2, "min_steps": 1, "per_device_batch_size": 2, "max_seq_len": 64}


@pytest.fixture
def model_server():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def approved(project, model_server, tmp_path, settings, tiny_base):
    """A tiny base, one approved correction, auto-deploy on, and a route serving acme-v0."""
    settings.ADAPTERS_DIR = tmp_path / "adapters"
    project.base_model = str(tiny_base)
    project.upstream_url = model_server.url
    project.settings = {
        "training": TRAINING,
        "gate": TINY_MODEL_GATE,
        "auto_deploy": True,
    }
    project.save()
    approve_a_correction(project)
    ModelRoute.objects.create(project=project, primary="acme-v0")


def route_of(project) -> tuple:
    route = ModelRoute.objects.get(project=project)
    return (route.primary, route.canary, route.canary_share, route.previous_primary, route.revision)


def cancel_on_first_call(monkeypatch, owner, name: str, run: TrainingRun, calls: list) -> None:
    """Wrap `owner.name`: its first call cancels `run` as the run page's button does; every
    call's keyword arguments are kept in `calls`."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if not calls:
            request_cancel(run=TrainingRun.objects.get(pk=run.pk))
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def assert_cancelled_with_routing_unchanged(run: TrainingRun, project, route_before) -> None:
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.finished_at is not None
    assert route_of(project) == route_before
    assert not checkpoint_dir(run).exists()


def test_a_run_that_is_not_cancelled_deploys(project, approved):
    """What the other tests stop: the same run, left alone, routes its adapter."""
    run = start_retrain(project=project)

    assert run_training(run.pk) == RunStatus.DEPLOYED
    assert route_of(project)[:4] == ("acme-v1", "", 0, "acme-v0")


def test_a_cancel_while_building_ends_the_run_before_any_training_step(
    project, approved, monkeypatch
):
    run = start_retrain(project=project)
    before = route_of(project)
    cancel_on_first_call(monkeypatch, trainer, "add_lora", run, [])  # the build's last step

    assert run_training(run.pk) == RunStatus.CANCELLED

    assert_cancelled_with_routing_unchanged(run, project, before)
    assert run.loss_curve == []
    assert not Adapter.objects.exists()


def test_a_cancel_while_training_stops_at_the_next_step(project, approved, monkeypatch):
    project.settings = {**project.settings, "training": {**TRAINING, "min_steps": 40}}
    project.save()
    run = start_retrain(project=project)
    before = route_of(project)
    original_train = trainer.train

    def train_and_cancel_after_the_first_step(*args, on_progress, **kwargs):
        def progress(step, *rest):
            on_progress(step, *rest)
            if step == 1:
                request_cancel(run=TrainingRun.objects.get(pk=run.pk))

        return original_train(*args, on_progress=progress, **kwargs)

    monkeypatch.setattr(trainer, "train", train_and_cancel_after_the_first_step)

    assert run_training(run.pk) == RunStatus.CANCELLED

    assert_cancelled_with_routing_unchanged(run, project, before)
    assert 1 <= len(run.loss_curve) < 40
    assert not Adapter.objects.exists()


def test_a_cancel_while_evaluating_stops_before_the_next_candidate(project, approved, monkeypatch):
    # The final adapter fails the gate (a tiny random model fixes nothing), so an earlier
    # checkpoint would be evaluated next.
    project.settings = {
        **project.settings,
        "training": {**TRAINING, "min_steps": 6, "save_every_steps": 2},
        "gate": {"min_fixed_fraction": 1},
    }
    project.save()
    run = start_retrain(project=project)
    before = route_of(project)
    calls: list[dict] = []
    cancel_on_first_call(monkeypatch, InProcessReplier, "greedy_replies", run, calls)

    assert run_training(run.pk) == RunStatus.CANCELLED

    assert_cancelled_with_routing_unchanged(run, project, before)
    # The first candidate's evaluation finished; the second never started.
    assert [call["adapter_on"] for call in calls] == [False, True]
    assert not Adapter.objects.exists()


def test_a_cancel_while_evaluating_the_only_candidate_writes_no_adapter(
    project, approved, monkeypatch
):
    run = start_retrain(project=project)
    before = route_of(project)
    cancel_on_first_call(monkeypatch, InProcessReplier, "greedy_replies", run, [])

    assert run_training(run.pk) == RunStatus.CANCELLED

    assert_cancelled_with_routing_unchanged(run, project, before)
    assert not Adapter.objects.exists()


def test_a_cancel_while_deploying_leaves_the_route_and_unloads_the_adapter(
    project, approved, monkeypatch, model_server
):
    run = start_retrain(project=project)
    before = route_of(project)
    # Between loading the adapter on the model server and changing the route.
    cancel_on_first_call(monkeypatch, learning_deploy, "canary_request", run, [])

    assert run_training(run.pk) == RunStatus.CANCELLED

    assert_cancelled_with_routing_unchanged(run, project, before)
    paths = [request["path"] for request in model_server.requests]
    assert "/v1/load_lora_adapter" in paths
    unloads = [r["body"] for r in model_server.requests if r["path"] == "/v1/unload_lora_adapter"]
    assert unloads == [{"lora_name": "acme-v1"}]
    adapter = Adapter.objects.get(run=run)  # written and evaluated, never routed
    [server] = adapter.eval_results["deploy"]["servers"]
    assert (server["url"], server["loaded"]) == (model_server.url, False)


def test_a_refusal_under_the_route_lock_leaves_the_route_as_it_was(project, approved):
    """The worker's deployed move runs in the route's transaction: refused, the route stays."""
    run = start_retrain(project=project)
    assert run_training(run.pk) == RunStatus.DEPLOYED
    adapter = Adapter.objects.get(run=run)
    ModelRoute.objects.filter(project=project).update(primary="acme-v0", previous_primary="")
    before = route_of(project)

    def refuse():
        raise TransitionRefused("cancelled meanwhile")

    with pytest.raises(TransitionRefused):
        deploy_adapter(adapter=adapter, before_route_change=refuse)

    assert route_of(project) == before
