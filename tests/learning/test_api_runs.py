from reviewapp.learning.models import Adapter, ModelRoute, RunStatus, TrainingRun


def test_retrain_with_nothing_approved_is_422(admin_api, project):
    response = admin_api.post("/api/v1/runs", {})
    assert response.status_code == 422
    assert "nothing is approved" in response.json()["detail"]


def test_retrain_queues_a_run_on_the_approved_targets(admin_api, approved_target):
    response = admin_api.post("/api/v1/runs", {"mode": "sft"})
    assert response.status_code == 202
    run = TrainingRun.objects.get(pk=response.json()["id"])
    assert run.status == RunStatus.QUEUED
    assert list(run.targets.all()) == [approved_target]
    assert run.config["mode"] == "sft"


def test_a_second_retrain_while_one_runs_is_409(admin_api, approved_target):
    assert admin_api.post("/api/v1/runs", {}).status_code == 202
    response = admin_api.post("/api/v1/runs", {})
    assert response.status_code == 409
    assert TrainingRun.objects.count() == 1


def test_an_unknown_mode_is_422(admin_api, approved_target):
    assert admin_api.post("/api/v1/runs", {"mode": "magic"}).status_code == 422


def test_run_state_is_readable_and_scoped(admin_api, other_admin_api, approved_target):
    run_id = admin_api.post("/api/v1/runs", {}).json()["id"]
    body = admin_api.get(f"/api/v1/runs/{run_id}").json()
    assert (body["status"], body["targets"], body["adapter"]) == ("queued", 1, None)
    assert other_admin_api.get(f"/api/v1/runs/{run_id}").status_code == 404


def test_a_run_whose_worker_vanished_is_reported_and_a_poll_writes_nothing(
    admin_api, approved_target
):
    from datetime import timedelta

    from django.utils import timezone

    run_id = admin_api.post("/api/v1/runs", {}).json()["id"]
    long_ago = timezone.now() - timedelta(hours=1)
    TrainingRun.objects.filter(pk=run_id).update(
        status=RunStatus.TRAINING, started_at=long_ago, heartbeat_at=long_ago
    )
    body = admin_api.get(f"/api/v1/runs/{run_id}").json()
    assert (body["status"], body["worker_lost"]) == ("training", True)
    assert TrainingRun.objects.get(pk=run_id).heartbeat_at == long_ago


def test_a_new_retrain_fails_a_run_whose_worker_vanished(admin_api, approved_target):
    from datetime import timedelta

    from django.utils import timezone

    run_id = admin_api.post("/api/v1/runs", {}).json()["id"]
    long_ago = timezone.now() - timedelta(hours=1)
    TrainingRun.objects.filter(pk=run_id).update(
        status=RunStatus.TRAINING, started_at=long_ago, heartbeat_at=long_ago
    )
    assert admin_api.post("/api/v1/runs", {}).status_code == 202
    body = admin_api.get(f"/api/v1/runs/{run_id}").json()
    assert body["status"] == "failed"
    assert "stopped reporting" in body["error"]


def test_adapters_list_their_deployment_state(admin_api, project):
    for version in (1, 2):
        Adapter.objects.create(
            project=project, version=version, name=f"acme-v{version}", path="/x",
            base_model="b", checksum="c",
        )  # fmt: skip
    ModelRoute.objects.create(project=project, primary="acme-v1", canary="acme-v2", canary_share=10)
    adapters = admin_api.get("/api/v1/adapters").json()["adapters"]
    assert [(a["name"], a["deployment"]) for a in adapters] == [
        ("acme-v2", {"state": "canary", "share": 10}),
        ("acme-v1", {"state": "serving", "share": 90}),
    ]


def test_a_runs_eval_summary_carries_what_it_was_judged_against_and_each_lesson(
    admin_api, approved_target
):
    run_id = admin_api.post("/api/v1/runs", {}).json()["id"]
    lesson = {
        "lesson": "Lead with the number.",
        "learned_by_serving": False,
        "trained": {"fixed": 1, "still failing": 0, "regressed": 0, "still passing": 0},
        "held_out_adherence": None,
    }
    TrainingRun.objects.filter(pk=run_id).update(
        metrics={
            "feedback_items": lesson["trained"],
            "items": [{"feedback_id": 1}],
            "per_lesson": [lesson],
            "serving": {"name": "acme-v1", "version": 1},
        }
    )

    body = admin_api.get(f"/api/v1/runs/{run_id}").json()

    assert body["eval"]["per_lesson"] == [lesson]
    assert body["eval"]["serving"] == {"name": "acme-v1", "version": 1}
    assert body["eval"]["feedback_items"] == lesson["trained"]
    assert "items" not in body["eval"]


def test_a_run_shows_the_plan_frozen_when_it_was_created(admin_api, project, approved_target):
    project.settings = {"gate": {"max_regressed": 2}}
    project.save()
    run_id = admin_api.post("/api/v1/runs", {}).json()["id"]
    project.settings = {"gate": {"max_regressed": 5}}
    project.save()
    plan = admin_api.get(f"/api/v1/runs/{run_id}").json()["plan"]
    assert plan["gate"]["max_regressed"] == 2
    assert plan["serving_adapter"] is None
    assert plan["conflicts"] == []
