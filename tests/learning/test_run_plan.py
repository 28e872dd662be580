"""A run's plan (gate thresholds, auto deploy, canary share, quorum, model servers) is frozen
when it is created: a settings change made while it trains does not change how it is judged or
deployed. Runs go end to end on a tiny model saved to disk, against FAKE model servers
(tests/fake_upstream.py) that the operator lists in MODEL_SERVERS."""

import pytest
from django.test import Client

from reviewapp.gateway.routing import upstream_urls
from reviewapp.learning.deploy import DeployError, deploy_adapter
from reviewapp.learning.models import (
    Adapter,
    Lesson,
    ModelRoute,
    RunStatus,
    TrainingRun,
)
from reviewapp.learning.plan import run_plan
from reviewapp.learning.runs import start_retrain
from reviewapp.learning.tasks import run_training
from reviewapp.projects.project_settings import update_settings
from tests.factories import approve_a_correction
from tests.fake_upstream import FakeUpstream, free_port
from tests.training.conftest import (  # noqa: F401
    TINY_MODEL_GATE,
    make_tiny_llama,
    make_tiny_tokenizer,
    tiny_base,
)

# Two updates: these runs are about what the plan decides, not about learning.
TRAINING = {"epochs": 2, "min_steps": 1, "per_device_batch_size": 2, "max_seq_len": 64}


@pytest.fixture
def servers(settings):
    """Two fake model servers, both the operator's."""
    started = [FakeUpstream().start(), FakeUpstream().start()]
    settings.MODEL_SERVERS = [server.url for server in started]
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def approved(project, servers, settings, tmp_path, tiny_base):  # noqa: F811
    """An approved correction in a project training a tiny model, whose gate passes anything
    and which deploys nothing unless a test says so."""
    settings.ADAPTERS_DIR = tmp_path / "adapters"
    project.base_model = str(tiny_base)
    project.save()
    update_settings(
        project=project,
        changes={
            "training": TRAINING,
            "gate": TINY_MODEL_GATE,
            "auto_deploy": False,
            "upstreams": [servers[0].url],
        },
    )
    return approve_a_correction(project)


def loads(server: FakeUpstream) -> list[str]:
    """The adapters a fake server was asked to load."""
    return [
        request["body"]["lora_name"]
        for request in server.requests
        if request["path"].endswith("/load_lora_adapter")
    ]


def test_a_run_freezes_the_plan_the_settings_give_when_it_is_created(
    project, approved_target, settings
):
    first, second = (f"http://127.0.0.1:{free_port()}/v1" for _ in range(2))
    settings.MODEL_SERVERS = [first, second]
    update_settings(
        project=project,
        changes={
            "gate": {"max_regressed": 2},
            "auto_deploy": False,
            "canary_share": 25,
            "deploy_quorum": 1,
            "upstreams": [first, second],
        },
    )
    run = start_retrain(project=project)
    update_settings(
        project=project,
        changes={
            "gate": {"max_regressed": 5},
            "auto_deploy": True,
            "canary_share": 100,
            "deploy_quorum": 2,
            "upstreams": [second],
        },
    )

    plan = run_plan(TrainingRun.objects.select_related("project").get(pk=run.pk))

    assert plan.gate.max_regressed == 2
    assert (plan.auto_deploy, plan.canary_share, plan.deploy_quorum) == (False, 25, 1)
    assert plan.upstreams == (first, second)


def test_without_a_list_the_run_freezes_the_servers_the_gateway_uses(project, approved_target):
    run = start_retrain(project=project)

    assert run.plan["upstreams"] == upstream_urls(project)


def test_a_gate_raised_after_the_run_started_does_not_judge_it(project, approved):
    run = start_retrain(project=project)
    # The tiny model fixes nothing: judged by this, the run would fail its gate.
    update_settings(project=project, changes={"gate": {"min_fixed_fraction": 1}})

    assert run_training(run.pk) == RunStatus.TRAINED

    run.refresh_from_db()
    assert run.metrics["gate"]["passed"] is True


def test_auto_deploy_turned_on_after_the_run_started_does_not_deploy_it(project, approved, servers):
    run = start_retrain(project=project)
    update_settings(project=project, changes={"auto_deploy": True})

    assert run_training(run.pk) == RunStatus.TRAINED

    assert not ModelRoute.objects.filter(project=project).exists()
    assert loads(servers[0]) == []


def test_a_canary_share_changed_after_the_run_started_does_not_change_its_deploy(project, approved):
    update_settings(project=project, changes={"auto_deploy": True, "canary_share": 30})
    run = start_retrain(project=project)
    update_settings(project=project, changes={"canary_share": 100})

    assert run_training(run.pk) == RunStatus.DEPLOYED

    route = ModelRoute.objects.get(project=project)
    assert (route.primary, route.canary, route.canary_share) == ("", Adapter.objects.get().name, 30)


def test_servers_changed_after_the_run_started_do_not_change_where_it_deploys(
    project, approved, servers
):
    first, second = servers
    update_settings(project=project, changes={"auto_deploy": True})
    run = start_retrain(project=project)
    update_settings(project=project, changes={"upstreams": [second.url]})

    assert run_training(run.pk) == RunStatus.DEPLOYED

    assert loads(first) == [Adapter.objects.get().name]
    assert second.requests == []


def test_a_server_the_operator_withdrew_after_the_run_started_is_not_called(
    project, approved, servers, settings
):
    first, second = servers
    update_settings(
        project=project, changes={"auto_deploy": True, "upstreams": [first.url, second.url]}
    )
    run = start_retrain(project=project)
    settings.MODEL_SERVERS = [second.url]  # the operator takes the first off the list

    assert run_training(run.pk) == RunStatus.DEPLOYED

    assert first.requests == []
    adapter = Adapter.objects.get()
    assert loads(second) == [adapter.name]
    assert [server["url"] for server in adapter.eval_results["deploy"]["servers"]] == [second.url]


def test_a_deploy_whose_servers_were_all_withdrawn_is_refused_and_routes_nothing(
    project, approved_target, settings
):
    settings.MODEL_SERVERS = [f"http://127.0.0.1:{free_port()}/v1"]
    update_settings(project=project, changes={"upstreams": settings.MODEL_SERVERS})
    run = start_retrain(project=project)
    settings.MODEL_SERVERS = []
    adapter = Adapter.objects.create(
        project=project, version=1, name="acme-v1", path="/adapters/acme-v1",
        base_model="b", checksum="c", run=run,
    )  # fmt: skip

    with pytest.raises(DeployError, match="is still one this deployment allows"):
        deploy_adapter(adapter=adapter, plan=run_plan(run))

    assert not ModelRoute.objects.filter(project=project).exists()


def page_of(user, run) -> str:
    client = Client()
    client.force_login(user)
    return client.get(f"/p/acme/runs/{run.pk}/").content.decode()


def test_the_run_page_shows_the_plan_frozen_at_creation(project, approved_target, alice, settings):
    server = f"http://127.0.0.1:{free_port()}/v1"
    settings.MODEL_SERVERS = [server]
    update_settings(
        project=project,
        changes={
            "gate": {"max_regressed": 2, "max_facts_lost_from_base": 1},
            "canary_share": 25,
            "upstreams": [server],
        },
    )
    run = start_retrain(project=project)
    update_settings(project=project, changes={"gate": {"max_regressed": 7}, "canary_share": 60})

    page = page_of(alice, run)

    assert "at most 2 feedback items regressed" in page
    assert "at most 1 general fact lost since the base, by any version" in page
    assert "to 25% of traffic as a canary" in page
    assert f"<code>{server}</code>;" in page
    assert "at most 7" not in page and "60%" not in page


def test_the_run_page_marks_a_server_the_operator_withdrew(
    project, approved_target, alice, settings
):
    server = f"http://127.0.0.1:{free_port()}/v1"
    settings.MODEL_SERVERS = [server]
    update_settings(project=project, changes={"upstreams": [server]})
    run = start_retrain(project=project)
    settings.MODEL_SERVERS = []

    page = page_of(alice, run)

    assert f'<code>{server}</code> <span class="error">(withdrawn by the operator since' in page


def test_a_run_from_before_plans_uses_the_settings_and_its_page_says_so(project, alice):
    run = TrainingRun.objects.create(project=project, config={})
    update_settings(project=project, changes={"canary_share": 40})

    assert run_plan(run).canary_share == 40
    assert "created before runs kept their plan" in page_of(alice, run)


def test_the_retrain_page_shows_the_plan_a_run_started_now_would_freeze(project, alice):
    update_settings(project=project, changes={"auto_deploy": False})
    client = Client()
    client.force_login(alice)

    page = client.get("/p/acme/retrain/").content.decode()

    assert "none without a click (auto deploy off)" in page


def test_a_retrain_in_an_unknown_mode_is_refused_and_starts_nothing(
    project, approved_target, alice
):
    client = Client()
    client.force_login(alice)

    response = client.post("/p/acme/retrain/", {"mode": "guess"})

    assert response.status_code == 422
    assert "mode: Select a valid choice" in response.content.decode()
    assert not TrainingRun.objects.exists()


def test_a_run_freezes_the_adapter_serving_when_it_is_created_and_is_judged_against_it(
    project, approved, alice
):
    """v1 deploys to all traffic; the next run records it as the gate's before side, keeps it
    when the route moves meanwhile, and its evaluation answers "before" with it."""
    update_settings(project=project, changes={"auto_deploy": True, "canary_share": 100})
    first = start_retrain(project=project)
    assert run_training(first.pk) == RunStatus.DEPLOYED
    v1 = Adapter.objects.get(run=first)
    assert first.plan["serving_adapter"] is None

    second = start_retrain(project=project)
    ModelRoute.objects.filter(project=project).update(primary="")  # moved after the start

    assert second.plan["serving_adapter"] == {"name": v1.name, "version": 1, "path": v1.path}
    assert run_plan(TrainingRun.objects.get(pk=second.pk)).serving_adapter.name == v1.name
    run_training(second.pk)
    second.refresh_from_db()
    assert second.metrics["serving"] == {"name": v1.name, "version": 1}
    # The same data and seed train the same adapter: against v1, nothing moves.
    first.refresh_from_db()
    rows = second.metrics["regression"]["items"]
    assert [row["before"]["reply"] for row in rows] == [
        row["after"]["reply"] for row in first.metrics["regression"]["items"]
    ]
    client = Client()
    client.force_login(alice)
    page = client.get(f"/p/{project.slug}/runs/{second.pk}/")
    # Each run's evaluation went into the ledger: one lesson, measured in both versions.
    [lesson] = Lesson.objects.filter(project=project)
    assert lesson.text == "say paris"
    assert [row.adapter.version for row in lesson.adherence.order_by("adapter__version")] == [1, 2]
    assert lesson.first_learned_by == v1
    assert [row["lesson"] for row in second.metrics["per_lesson"]] == ["say paris"]
    assert second.metrics["per_lesson"][0]["learned_by_serving"] is True
    assert f"<strong>{v1.name}</strong> (version 1), the adapter serving" in page.content.decode()
