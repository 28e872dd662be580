import pytest
from django.test import Client

from reviewapp.learning.models import DistillationTarget, RunStatus, TargetState, TrainingRun
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def proposed(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    trace = project.traces.get()
    feedback, _ = record_feedback(trace=trace, text="Begin with 'Answer:'.", turn=4)
    return DistillationTarget.objects.create(
        feedback=feedback,
        turn=4,
        source="hint",
        student_context=trace.body_json()["messages"][:4],
        original=trace.body_json()["messages"][4],
        target={"role": "assistant", "content": "Answer: 84."},
    )


def test_targets_show_a_rewritten_answer_beside_the_original(bob, proposed):
    html = logged_in(bob).get("/p/acme/targets/").content.decode()
    # Only "84" kept of "12 * 7 is 84.": too little for a word diff to read.
    assert "<figcaption>Original answer</figcaption><pre>12 * 7 is 84.</pre>" in html
    assert "<pre>Answer: 84.</pre>" in html


def test_retrain_page_shows_what_will_be_used_and_what_is_left_out(alice, proposed):
    html = logged_in(alice).get("/p/acme/retrain/").content.decode()
    assert "<strong>0</strong> approved targets" in html
    assert "1 proposed target (not approved)" in html


def test_an_admin_clicks_retrain_and_lands_on_the_run(alice, proposed):
    proposed.state = TargetState.APPROVED
    proposed.save()
    response = logged_in(alice).post("/p/acme/retrain/", {"mode": "sft"})
    run = TrainingRun.objects.get()
    assert response["Location"] == f"/p/acme/runs/{run.pk}/"
    assert run.status == RunStatus.QUEUED


def test_retrain_with_nothing_approved_explains_why(alice, proposed):
    response = logged_in(alice).post("/p/acme/retrain/", {"mode": "sft"})
    assert response.status_code == 422
    assert "nothing is approved" in response.content.decode()


def test_reviewers_cannot_start_a_retrain(bob, proposed):
    assert logged_in(bob).post("/p/acme/retrain/", {"mode": "sft"}).status_code == 403
    assert not TrainingRun.objects.exists()


def test_a_running_runs_page_polls_and_a_finished_one_stops(alice, project):
    run = TrainingRun.objects.create(
        project=project, config={}, status=RunStatus.TRAINING,
        progress={"step": 3, "total_steps": 12, "loss": 1.5, "tokens_per_s": 40, "eta_s": 9},
        loss_curve=[2.0, 1.7, 1.5],
    )  # fmt: skip
    from django.utils import timezone

    TrainingRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    html = logged_in(alice).get(f"/p/acme/runs/{run.pk}/").content.decode()
    assert 'hx-trigger="every 2s"' in html
    assert 'value="25"' in html and "<polyline" in html
    TrainingRun.objects.filter(pk=run.pk).update(status=RunStatus.TRAINED)
    html = logged_in(alice).get(f"/p/acme/runs/{run.pk}/").content.decode()
    assert "every 2s" not in html


def test_cancel_marks_a_queued_run_cancelled(alice, project):
    run = TrainingRun.objects.create(project=project, config={})
    logged_in(alice).post(f"/p/acme/runs/{run.pk}/cancel/")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_another_projects_run_is_404(mallory, project):
    run = TrainingRun.objects.create(project=project, config={})
    assert logged_in(mallory).get(f"/p/acme/runs/{run.pk}/").status_code == 404


def _with_checks(target: DistillationTarget, *, passes: bool) -> DistillationTarget:
    target.feedback.checks = [{"kind": "regex", "value": "^Answer:"}]
    target.feedback.save(update_fields=["checks"])
    target.passes_checks = passes
    target.save(update_fields=["passes_checks"])
    return target


def test_an_admin_turns_on_auto_approve_and_approves_what_passes_now(alice, project, proposed):
    _with_checks(proposed, passes=True)
    response = logged_in(alice).post(
        "/p/acme/targets/policy/",
        {"policy": "checks_pass", "apply_to_proposed": "on"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    assert "1 proposed target approved now" in response.content.decode()
    project.refresh_from_db()
    assert project.settings["auto_approve"] == "checks_pass"
    proposed.refresh_from_db()
    assert proposed.state == TargetState.APPROVED


def test_auto_approve_leaves_failing_targets_and_feedback_without_checks_to_reviewers(
    alice, project, proposed
):
    _with_checks(proposed, passes=False)
    logged_in(alice).post(
        "/p/acme/targets/policy/", {"policy": "checks_pass", "apply_to_proposed": "on"}
    )
    proposed.refresh_from_db()
    assert proposed.state == TargetState.PROPOSED
    proposed.feedback.checks = []
    proposed.feedback.save(update_fields=["checks"])
    proposed.passes_checks = True
    proposed.save(update_fields=["passes_checks"])
    logged_in(alice).post(
        "/p/acme/targets/policy/", {"policy": "checks_pass", "apply_to_proposed": "on"}
    )
    proposed.refresh_from_db()
    assert proposed.state == TargetState.PROPOSED


def test_the_policy_alone_approves_nothing_already_proposed(alice, project, proposed):
    _with_checks(proposed, passes=True)
    response = logged_in(alice).post("/p/acme/targets/policy/", {"policy": "checks_pass"})
    assert response.status_code == 302
    proposed.refresh_from_db()
    assert proposed.state == TargetState.PROPOSED
    page = logged_in(alice).get("/p/acme/targets/").content.decode()
    assert "targets that pass their feedback&#x27;s checks are approved" in page


def test_an_unknown_policy_is_422_and_changes_nothing(alice, project, proposed):
    response = logged_in(alice).post(
        "/p/acme/targets/policy/", {"policy": "everything"}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422
    assert "Select a valid choice" in response.content.decode()
    project.refresh_from_db()
    assert "auto_approve" not in project.settings


def test_only_admins_of_the_project_set_the_policy(bob, mallory, project, proposed):
    assert logged_in(bob).post("/p/acme/targets/policy/", {"policy": "manual"}).status_code == 403
    response = logged_in(mallory).post("/p/acme/targets/policy/", {"policy": "manual"})
    assert response.status_code == 404
    project.refresh_from_db()
    assert "auto_approve" not in project.settings


def test_a_runs_page_says_where_its_replies_came_from_and_how_long_they_took(alice, project):
    run = TrainingRun.objects.create(
        project=project, config={}, status=RunStatus.GATE_FAILED,
        metrics={
            "feedback_items": {"fixed": 1, "still failing": 0, "regressed": 0, "still passing": 0},
            "evaluated_on": {"server": "http://127.0.0.1:8100/v1", "server_replies": 68,
                             "in_process_replies": 0, "error": "", "reply_seconds": 61.37},
            "phase_seconds": {"building": 1.1, "training": 137.9, "evaluating": 111.3},
        },
    )  # fmt: skip
    html = logged_in(alice).get(f"/p/acme/runs/{run.pk}/").content.decode()
    assert "on the model server http://127.0.0.1:8100/v1 (68), in 61 s." in html
    assert "1.1 s building" in html and "137.9 s training and 111.3 s evaluating" in html
