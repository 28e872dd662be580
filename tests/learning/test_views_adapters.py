"""Adapter pages: the versions list, one version's lineage, and the deploy buttons.

Deploys that must load an adapter talk to tests/fake_upstream.py, a FAKE model server (it
answers /v1/models, /v1/load_lora_adapter and chat completions the way vLLM does, over real
HTTP); the real vLLM deploy is exercised in test_deploy_vllm.py.
"""

import asyncio

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from reviewapp.learning.deploy import promote_canary
from reviewapp.learning.models import (
    Adapter,
    DistillationTarget,
    ModelRoute,
    RunStatus,
    TargetState,
    TrainingRun,
)
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.e2e.test_xss import PAYLOADS, MarkupFromContent
from tests.factories import make_trace
from tests.fake_upstream import FakeUpstream, free_port

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def side(reply: str, passed: bool) -> dict:
    check = {"kind": "regex", "value": "^Answer:", "passed": passed}
    return {"reply": reply, "checks": [check], "passed": passed}


def report(target_id: int, feedback_id: int, trace_id: int, *, reply: str = "12 * 7") -> dict:
    """A run's metrics as the worker stores them (the newer sections are added per test)."""
    item = {
        "target_id": target_id,
        "feedback_id": feedback_id,
        "trace_id": trace_id,
        "status": "fixed",
        "before": side(reply, False),
        "after": side("Answer: 84.", True),
        "divergence_before": 1.25,
        "divergence_after": 0.5,
    }
    return {
        "feedback_items": {"fixed": 1, "still failing": 0, "regressed": 0, "still passing": 0},
        "items": [item],
        "gate": {"passed": True, "reason": "1 of 1 failing feedback items fixed; 0 regressed"},
        "train": {"steps": 10, "tokens": 530, "seconds": 4.2, "skipped": 0},
    }


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


def make_adapter(project, trace, version: int, *, reviewer=None, metrics=None, **feedback):
    feedback_row, _ = record_feedback(
        trace=trace,
        turn=4,
        author=feedback.pop("author", "carol"),
        text=feedback.pop("text", f"Begin with 'Answer:' (v{version})."),
    )
    target = DistillationTarget.objects.create(
        feedback=feedback_row,
        turn=4,
        source="hint",
        student_context=trace.body_json()["messages"][:4],
        original=trace.body_json()["messages"][4],
        target={"role": "assistant", "content": f"Answer: 84 (v{version})."},
        state=TargetState.APPROVED,
        reviewed_by=reviewer,
    )
    metrics = metrics or report(target.pk, feedback_row.pk, trace.pk)
    run = TrainingRun.objects.create(
        project=project,
        config={"mode": "sft", "lora_r": 16, "learning_rate": 0.0001},
        status=RunStatus.TRAINED,
        metrics=metrics,
    )
    run.targets.add(target)
    return Adapter.objects.create(
        project=project,
        version=version,
        name=f"acme-v{version}",
        path=f"/adapters/acme-v{version}",
        base_model="SmolLM2-135M-Instruct",
        checksum=f"{version:064d}",
        run=run,
        eval_results=metrics,
    )


@pytest.fixture
def adapter(project, trace, bob):
    return make_adapter(project, trace, 1, reviewer=bob)


@pytest.fixture
def fake_model_server(project):
    """A FAKE vLLM the project's gateway and deploys point at."""
    server = FakeUpstream().start()
    project.upstream_url = server.url
    project.save()
    yield server
    server.stop()


def route_of(project) -> tuple:
    route = ModelRoute.objects.filter(project=project).first()
    return (route.primary, route.canary, route.canary_share) if route else ("", "", 0)


# Reading


def test_it_asks_anonymous_people_to_log_in(adapter):
    for url in ("/p/acme/adapters/", "/p/acme/adapters/1/"):
        response = Client().get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_list_shows_every_version_newest_first_with_where_traffic_goes(project, trace, victor):
    for version in (1, 2, 3):
        make_adapter(project, trace, version)
    ModelRoute.objects.create(
        project=project, primary="acme-v2", canary="acme-v3", canary_share=10,
        previous_primary="acme-v1",
    )  # fmt: skip
    html = logged_in(victor).get("/p/acme/adapters/").content.decode()
    assert html.index("acme-v3") < html.index('id="adapter-2"') < html.index('id="adapter-1"')
    assert "canary 10%" in html and "primary 90%" in html and "previous primary" in html
    assert "for 10% of calls" in html  # the route now
    assert ">passed<" in html and "trained" in html  # gate and run status
    assert "/p/acme/traces/?adapter=acme-v2" in html


def test_the_list_says_when_the_base_model_answers(project, victor):
    html = logged_in(victor).get("/p/acme/adapters/").content.decode()
    assert "the base model" in html and "No adapter is trained yet" in html


def test_the_detail_page_shows_the_lineage(adapter, victor, bob):
    html = logged_in(victor).get("/p/acme/adapters/1/").content.decode()
    feedback = adapter.run.targets.get().feedback
    assert "SmolLM2-135M-Instruct" in html and adapter.checksum in html and adapter.path in html
    assert "learning_rate" in html  # the run's config
    assert "Begin with &#x27;Answer:&#x27; (v1)." in html  # the feedback it learned from
    assert f"/p/acme/traces/{feedback.trace_id}/#turn-4" in html
    assert "12 * 7 is 84." in html and "Answer: 84 (v1)." in html  # original beside the target
    assert "<pre>12 * 7</pre>" in html and "<pre>Answer: 84.</pre>" in html  # before / after
    assert "(author as claimed: carol)" in html  # written without a key or a person: a claim
    assert ">bob<" in html  # the approver
    assert "1 target from 1 feedback item" in html
    assert "1 of 1 failing feedback items fixed" in html  # the gate's reason
    assert "/p/acme/traces/?adapter=acme-v1" in html
    assert html.count('<svg class="chart bars"') == 2  # statuses and divergence
    assert "1.250 → 0.500" in html


def test_held_out_per_tag_and_regression_sections_show_when_present(project, trace, victor):
    adapter = make_adapter(project, trace, 1)
    held_out_feedback, _ = record_feedback(trace=trace, turn=4, text="Say it in French.")
    metrics = {
        **adapter.run.metrics,
        "per_tag": {"too-long": {"fixed": 2, "still failing": 1}},
        "held_out": {
            "summary": {"fixed": 0, "still failing": 1, "regressed": 0, "still passing": 0},
            "items": [{"feedback_id": held_out_feedback.pk, "status": "still failing",
                       "before": {"reply": "84", "passed": False},
                       "after": {"reply": "quatre-vingt-quatre", "passed": False}}],
        },
        "regression": {
            "summary": {"fixed": 0, "still failing": 0, "regressed": 1, "still passing": 1},
            "mean_drift": 0.0312,
            "facts": {"asked": 22, "right_by_base": 22,
                      "lost_from_base": ["Who wrote Hamlet?"]},
            "items": [
                {"source": "general", "prompt": "What is the capital of France?",
                 "status": "still passing", "before": {"reply": "Paris."},
                 "after": {"reply": "Paris."}, "drift": 0.01},
                {"source": "trace", "prompt": "What is 12 * 7?", "trace_id": trace.pk,
                 "status": "regressed", "before": {"reply": "84"}, "after": {"reply": "12"}},
            ],
        },
        "exclusions": {"total": 5, "excluded": {"policy_timeout": 3}},
    }  # fmt: skip
    TrainingRun.objects.filter(pk=adapter.run_id).update(metrics=metrics)
    html = logged_in(victor).get("/p/acme/adapters/1/").content.decode()
    assert 'id="per-tag"' in html and "too-long" in html
    assert 'id="held-out-eval"' in html and "quatre-vingt-quatre" in html
    assert "Say it in French." in html
    assert "fixed 0 · still failing 1 · regressed 0 · still passing 0" in html  # held out
    assert "capital of France" in html and "mean drift from base 0.0312" in html
    assert "lost since the base (by this version or an earlier one): 1 of the 22" in html
    assert '"Who wrote Hamlet?"' in html
    assert f"/p/acme/traces/{trace.pk}/" in html
    assert "policy_timeout 3" in html  # what the training data left out


@pytest.mark.parametrize(
    ("guarded_by", "says"),
    [("acme-v1", "the forgetting guard holding it to acme-v1"), ("base", None)],
)
def test_the_page_says_what_the_run_started_from_and_what_the_guard_held_it_to(
    project, trace, victor, guarded_by, says
):
    train = {"steps": 24, "tokens": 900, "seconds": 12.0, "started_from": "acme-v1"}
    make_adapter(project, trace, 2, metrics={"train": {**train, "guarded_by": guarded_by}})

    html = logged_in(victor).get("/p/acme/adapters/2/").content.decode()

    assert "starting from acme-v1" in html
    assert ("forgetting guard holding it" in html) == bool(says)
    if says:
        assert says in html


def test_an_old_report_without_the_new_sections_renders(project, trace, victor):
    adapter = make_adapter(project, trace, 1, metrics={"feedback_items": {"fixed": 1}})
    Adapter.objects.filter(pk=adapter.pk).update(run=None)
    response = logged_in(victor).get("/p/acme/adapters/1/")
    assert response.status_code == 200
    assert "none recorded" in response.content.decode()


def test_untrusted_text_is_escaped(project, trace, victor):
    adapter = make_adapter(project, trace, 1, text=XSS, author=XSS)
    target = adapter.run.targets.get()
    metrics = report(target.pk, target.feedback_id, trace.pk, reply=XSS)
    metrics["per_tag"] = {XSS: {"fixed": 1}}
    TrainingRun.objects.filter(pk=adapter.run_id).update(metrics=metrics)
    html = logged_in(victor).get("/p/acme/adapters/1/").content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html


class MarkupInMain(MarkupFromContent):
    """The injection corpus's parser on what a page shows in <main>; the adapter page's own
    charts are the one <svg> allowed there."""

    in_main = False

    def handle_starttag(self, tag, attrs):
        self.in_main = self.in_main or tag == "main"
        own_chart = tag == "svg" and (dict(attrs).get("class") or "").startswith("chart")
        if self.in_main and not own_chart:
            super().handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        self.in_main = self.in_main and tag != "main"
        super().handle_endtag(tag)


def test_injection_payloads_anywhere_in_the_lineage_stay_text(project, trace, alice):
    adapter = make_adapter(project, trace, 1)
    run = adapter.run
    items, tags, regression = [], {}, []
    for payload in PAYLOADS:
        feedback, _ = record_feedback(trace=trace, turn=4, text=payload, author=payload[:200])
        target = DistillationTarget.objects.create(
            feedback=feedback, turn=4, source=payload[:16], student_context=[],
            original={"role": "assistant", "content": payload,
                      "tool_calls": [{"function": {"name": payload, "arguments": payload}}]},
            target={"role": "assistant", "content": payload}, state=TargetState.APPROVED,
        )  # fmt: skip
        run.targets.add(target)
        sides = {"reply": payload, "checks": [{"kind": payload, "value": payload}]}
        items.append({"target_id": target.pk, "status": payload, "before": sides, "after": sides})
        tags[payload] = {"fixed": 1}
        regression.append({"source": payload, "prompt": payload, "status": payload,
                           "before": sides, "after": sides, "trace_id": trace.pk})  # fmt: skip
    run.metrics = {
        **run.metrics, "items": items, "per_tag": tags,
        "gate": {"passed": True, "reason": PAYLOADS[0]},
        "regression": {"summary": {PAYLOADS[1]: 1}, "items": regression},
        "exclusions": {payload: {payload: 1} for payload in PAYLOADS},
    }  # fmt: skip
    run.config = {payload: payload for payload in PAYLOADS}
    run.save()
    client = logged_in(alice)
    for url in ("/p/acme/adapters/", "/p/acme/adapters/1/", f"/p/acme/traces/{trace.pk}/"):
        html = client.get(url).content.decode()
        parser = MarkupInMain()
        parser.feed(html)
        assert parser.problems == [], url
    assert html.count("learned by") == len(PAYLOADS) + 1  # the trace page listed them all


def test_another_projects_adapter_is_not_found(adapter, mallory, other_project):
    client = logged_in(mallory)
    assert client.get("/p/acme/adapters/1/").status_code == 404
    assert client.get("/p/acme/adapters/").status_code == 404
    assert client.get("/p/globex/adapters/1/").status_code == 404


# Buttons


def test_deploy_loads_the_adapter_and_routes_all_traffic(adapter, alice, fake_model_server):
    response = logged_in(alice).post("/p/acme/adapters/1/deploy/", {"share": "100"})
    assert response.status_code == 302 and response["Location"] == "/p/acme/adapters/1/"
    loads = [r for r in fake_model_server.requests if r["path"].endswith("/load_lora_adapter")]
    assert loads[0]["body"] == {"lora_name": "acme-v1", "lora_path": "/adapters/acme-v1"}
    assert route_of(adapter.project) == ("acme-v1", "", 0)


def test_deploy_as_a_canary_with_htmx_rerenders_the_deployment_block(
    adapter, alice, fake_model_server
):
    response = logged_in(alice).post(
        "/p/acme/adapters/1/deploy/", {"share": "25"}, headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert response.status_code == 200 and html.lstrip().startswith('<div id="deployment"')
    assert "canary 25%" in html and 'id="promote"' in html
    assert route_of(adapter.project) == ("", "acme-v1", 25)


def test_a_model_server_that_is_down_is_a_502_and_routing_is_unchanged(adapter, alice, monkeypatch):
    monkeypatch.setattr("training.deploy.time.sleep", lambda seconds: None)  # no backoff waits
    adapter.project.upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    adapter.project.save()
    ModelRoute.objects.create(project=adapter.project, primary="acme-v0")
    response = logged_in(alice).post("/p/acme/adapters/1/deploy/", {"share": "100"})
    assert response.status_code == 502
    assert "routing is unchanged" in response.content.decode()
    assert route_of(adapter.project) == ("acme-v0", "", 0)


def test_change_share_promote_and_rollback_move_the_route(project, trace, alice):
    make_adapter(project, trace, 1)
    make_adapter(project, trace, 2)
    ModelRoute.objects.create(project=project, primary="acme-v1", canary="acme-v2", canary_share=10)
    client = logged_in(alice)
    assert client.post("/p/acme/adapters/2/share/", {"share": "40"}).status_code == 302
    assert route_of(project) == ("acme-v1", "acme-v2", 40)
    assert client.post("/p/acme/adapters/2/promote/").status_code == 302
    assert route_of(project) == ("acme-v2", "", 0)
    assert ModelRoute.objects.get(project=project).previous_primary == "acme-v1"
    assert client.post("/p/acme/adapters/2/rollback/").status_code == 302
    assert route_of(project) == ("acme-v1", "", 0)


def test_rolling_back_a_canary_drops_it(project, trace, alice):
    make_adapter(project, trace, 1)
    ModelRoute.objects.create(project=project, canary="acme-v1", canary_share=30)
    response = logged_in(alice).post("/p/acme/adapters/1/rollback/", headers={"HX-Request": "true"})
    assert response.status_code == 200 and "not serving" in response.content.decode()
    assert route_of(project) == ("", "", 0)


@pytest.mark.parametrize(
    ("action", "share"),
    [("deploy", "0"), ("deploy", "101"), ("deploy", "lots"), ("share", "100"), ("share", "")],
)
def test_a_bad_share_is_422_and_changes_nothing(project, trace, alice, action, share):
    make_adapter(project, trace, 1)
    ModelRoute.objects.create(project=project, canary="acme-v1", canary_share=10)
    response = logged_in(alice).post(
        f"/p/acme/adapters/1/{action}/", {"share": share}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422
    assert "deployment-error" in response.content.decode()
    assert route_of(project) == ("", "acme-v1", 10)


def test_actions_that_do_not_fit_the_route_are_409(project, trace, alice):
    make_adapter(project, trace, 1)
    client = logged_in(alice)
    assert client.post("/p/acme/adapters/1/promote/").status_code == 409
    assert client.post("/p/acme/adapters/1/share/", {"share": "20"}).status_code == 409
    assert client.post("/p/acme/adapters/1/rollback/").status_code == 409
    assert route_of(project) == ("", "", 0)


class UpstreamWhileAnotherAdminPromotes(FakeUpstream):
    """A FAKE model server during whose adapter load another admin promotes a canary, from a
    thread and database connection of its own, as another web process would."""

    def __init__(self, canary: Adapter):
        super().__init__()
        self.canary = canary

    def _promote(self) -> None:
        try:
            promote_canary(adapter=self.canary)
        finally:
            connection.close()

    async def app(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/load_lora_adapter"):
            await asyncio.to_thread(self._promote)
        await super().app(scope, receive, send)


@pytest.mark.django_db(transaction=True)
def test_a_route_that_changed_while_the_adapter_loaded_is_409(project, trace, alice):
    make_adapter(project, trace, 1)
    canary = make_adapter(project, trace, 2)
    ModelRoute.objects.create(project=project, canary="acme-v2", canary_share=10)
    server = UpstreamWhileAnotherAdminPromotes(canary).start()
    project.upstream_url = server.url
    project.save()
    try:
        response = logged_in(alice).post("/p/acme/adapters/1/deploy/", {"share": "100"})
    finally:
        server.stop()
    assert response.status_code == 409
    assert "route changed while acme-v1 was loading" in response.content.decode()
    assert route_of(project) == ("acme-v2", "", 0)  # the other admin's promotion stands


def test_rolling_back_from_a_stale_page_is_409_and_keeps_the_newer_deploy(project, trace, alice):
    make_adapter(project, trace, 1)
    ModelRoute.objects.create(project=project, primary="acme-v2", previous_primary="acme-v1")
    response = logged_in(alice).post("/p/acme/adapters/1/rollback/")
    assert response.status_code == 409 and "acme-v1 is not serving" in response.content.decode()
    assert route_of(project) == ("acme-v2", "", 0)


def test_an_adapter_the_gate_refused_is_not_deployed(project, trace, alice, fake_model_server):
    adapter = make_adapter(project, trace, 1)
    metrics = {**adapter.run.metrics, "gate": {"passed": False, "reason": "1 regressed"}}
    TrainingRun.objects.filter(pk=adapter.run_id).update(metrics=metrics)
    response = logged_in(alice).post("/p/acme/adapters/1/deploy/", {"share": "100"})
    assert response.status_code == 409 and "1 regressed" in response.content.decode()
    assert fake_model_server.requests == []
    assert route_of(project) == ("", "", 0)


def test_only_admins_of_the_project_press_the_buttons(project, trace, bob, victor, mallory):
    make_adapter(project, trace, 1)
    ModelRoute.objects.create(project=project, canary="acme-v1", canary_share=10)
    refusals = ((bob, "acme", 403), (victor, "acme", 403), (mallory, "acme", 404),
                (mallory, "globex", 404), (None, "acme", 302))  # fmt: skip
    for action in ("deploy", "promote", "share", "rollback"):
        for user, slug, status in refusals:
            client = logged_in(user) if user else Client()
            response = client.post(f"/p/{slug}/adapters/1/{action}/", {"share": "50"})
            assert response.status_code == status, (action, user, slug)
    assert route_of(project) == ("", "acme-v1", 10)


def test_viewers_see_no_buttons(adapter, victor, alice):
    assert 'id="deploy-all"' not in logged_in(victor).get("/p/acme/adapters/1/").content.decode()
    assert 'id="deploy-all"' in logged_in(alice).get("/p/acme/adapters/1/").content.decode()


# Where the lineage shows elsewhere


def test_the_trace_page_says_which_adapters_learned_from_each_feedback(project, trace, victor):
    make_adapter(project, trace, 1, text="Be brief.")
    make_adapter(project, trace, 3, text="Be brief.")  # the same feedback, learned again
    html = logged_in(victor).get(f"/p/acme/traces/{trace.pk}/").content.decode()
    assert (
        'learned by <a href="/p/acme/adapters/1/">v1</a>, <a href="/p/acme/adapters/3/">v3</a>'
        in html
    )


def test_held_out_feedback_is_not_shown_as_learned(project, trace, victor, api):
    adapter = make_adapter(project, trace, 1)
    feedback_id = adapter.run.targets.get().feedback_id
    metrics = {**adapter.run.metrics, "held_out": {"items": [{"feedback_id": feedback_id}]}}
    TrainingRun.objects.filter(pk=adapter.run_id).update(metrics=metrics)
    assert "learned by" not in logged_in(victor).get(f"/p/acme/traces/{trace.pk}/").content.decode()
    assert api.get("/api/v1/traces/t-1").json()["review"]["feedback"][0]["adapters"] == []


def test_the_api_trace_names_the_adapters_per_feedback(project, trace, api):
    make_adapter(project, trace, 1, text="Be brief.")
    make_adapter(project, trace, 2, text="Be brief.")
    record_feedback(trace=trace, turn=4, text="Nobody trained on this yet.")
    feedback = api.get("/api/v1/traces/t-1").json()["review"]["feedback"]
    assert [item["adapters"] for item in feedback] == [["acme-v1", "acme-v2"], []]


def test_the_run_page_links_to_its_adapter(adapter, victor):
    html = logged_in(victor).get(f"/p/acme/runs/{adapter.run_id}/").content.decode()
    assert 'href="/p/acme/adapters/1/" id="run-adapter"' in html


def test_which_adapters_learned_costs_the_trace_page_one_query_however_much_feedback(
    project, trace, victor
):
    client = logged_in(victor)
    make_adapter(project, trace, 1)
    with CaptureQueriesContext(connection) as one:
        client.get(f"/p/acme/traces/{trace.pk}/")
    for version in (2, 3, 4):
        make_adapter(project, trace, version)
    with CaptureQueriesContext(connection) as four:
        html = client.get(f"/p/acme/traces/{trace.pk}/").content.decode()
    assert html.count("learned by") == 4
    assert len(four) == len(one)
    assert sum("reviewapp_adapter" in query["sql"] for query in four) == 1
