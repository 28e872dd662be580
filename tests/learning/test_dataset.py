"""Training-data accounting: every candidate is included or counted under one reason."""

import orjson
import pytest

from reviewapp.learning.dataset import DataPolicy, build_training_set, set_data_policy
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.runs import RetrainError, start_retrain
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace


def _target(trace, text: str, *, state=TargetState.APPROVED, passes_checks=True, reply="84."):
    feedback, _ = record_feedback(trace=trace, text=text, turn=4)
    messages = trace.body_json()["messages"]
    return DistillationTarget.objects.create(
        feedback=feedback, turn=4, source="hint", student_context=messages[:4],
        target={"role": "assistant", "content": reply}, state=state, passes_checks=passes_checks,
    )  # fmt: skip


@pytest.fixture
def mix(project):
    """Traces that ended three ways, and feedback in every state a candidate can be in."""
    ingest_traces(
        project=project,
        raw_items=[
            make_trace("done"),
            make_trace("slow-1", termination="timeout"),
            make_trace("slow-2", termination="timeout"),
            make_trace("broken", termination="tool_error"),
        ],
    )
    traces = {trace.external_id: trace for trace in project.traces.all()}
    done, slow_1, slow_2, broken = (traces[k] for k in ("done", "slow-1", "slow-2", "broken"))
    _target(done, "Lead with the number.")  # included
    _target(done, "Say it shorter.", reply="84")  # included
    _target(done, "Same reply again.", reply="84")  # duplicate of the one above
    _target(done, "Rejected.", state=TargetState.REJECTED)
    _target(done, "Not reviewed.", state=TargetState.PROPOSED)
    _target(done, "Fails checks.", passes_checks=False, reply="Eighty-four.")
    _target(done, "Edited by a reviewer.", state=TargetState.EDITED, passes_checks=False,
            reply="Answer: 84")  # fmt: skip
    _target(slow_1, "Answer before the deadline.", reply="Quick: 84")
    _target(slow_2, "Answer before the deadline too.", reply="Quickly: 84")
    _target(broken, "Say the tool failed.", reply="The calculator failed.")
    record_feedback(trace=done, text="No target yet.", turn=4)
    dismissed, _ = record_feedback(trace=done, text="Dismissed.", turn=4)
    Feedback.objects.filter(pk=dismissed.pk).update(status=FeedbackStatus.DISMISSED)
    return project


def test_the_default_policy_keeps_timeouts_and_tool_errors_and_counts_the_rest(mix):
    training_set = build_training_set(project=mix)
    assert training_set.included == 6
    assert training_set.excluded == {
        "feedback_dismissed": 1,
        "feedback_without_targets": 1,
        "target_not_reviewed": 1,
        "target_rejected": 1,
        "fails_checks": 1,
        "policy_timeout": 0,
        "policy_tool_error": 0,
        "duplicate": 1,
        "superseded": 0,
    }
    assert training_set.total == 12 == training_set.included + sum(training_set.excluded.values())
    assert training_set.kept_failures == {"timeout": 2, "tool_error": 1}


def test_excluding_timeouts_and_tool_errors_counts_them_never_silently(mix):
    set_data_policy(project=mix, policy=DataPolicy(timeout="exclude", tool_error="exclude"))
    mix.refresh_from_db()
    training_set = build_training_set(project=mix)
    assert training_set.included == 3
    assert training_set.excluded["policy_timeout"] == 2
    assert training_set.excluded["policy_tool_error"] == 1
    assert training_set.total == 12 == training_set.included + sum(training_set.excluded.values())
    assert training_set.kept_failures == {}
    terminations = {target.feedback.trace.termination for target in training_set.targets}
    assert terminations == {"completed"}


def test_keeping_targets_that_fail_checks_is_a_policy_choice(mix):
    training_set = build_training_set(project=mix, policy=DataPolicy(failing_checks="keep"))
    assert (training_set.included, training_set.excluded["fails_checks"]) == (7, 0)


def test_a_run_stores_what_was_left_out_and_trains_on_what_was_kept(mix):
    run = start_retrain(project=mix)
    exclusions = run.metrics["exclusions"]
    assert (exclusions["included"], exclusions["total"]) == (6, 12)
    assert exclusions["excluded"]["duplicate"] == 1
    assert exclusions["policy"] == {
        "timeout": "keep", "tool_error": "keep", "failing_checks": "exclude"
    }  # fmt: skip
    assert run.targets.count() == 6


def test_a_retrain_whose_approved_targets_are_all_excluded_says_why(project):
    ingest_traces(project=project, raw_items=[make_trace("slow", termination="timeout")])
    _target(project.traces.get(), "Faster.")
    set_data_policy(project=project, policy=DataPolicy(timeout="exclude"))
    project.refresh_from_db()
    with pytest.raises(RetrainError, match="1 trace timed out"):
        start_retrain(project=project)


def test_the_export_applies_the_policy_and_reports_the_exclusions(mix, admin_api):
    set_data_policy(project=mix, policy=DataPolicy(timeout="exclude"))
    response = admin_api.get("/api/v1/export.jsonl")
    assert response.status_code == 200
    replies = [
        orjson.loads(line)["messages"][-1]["content"]
        for line in b"".join(response.streaming_content).splitlines()
    ]
    assert "Quick: 84" not in replies and "The calculator failed." in replies
    assert len(replies) == 4
    excluded = orjson.loads(response["X-Training-Exclusions"])
    assert (excluded["policy_timeout"], excluded["duplicate"]) == (2, 1)


def test_reviewed_timeouts_are_failures_and_never_exported_as_successes(project, admin_api, bob):
    ingest_traces(
        project=project,
        raw_items=[make_trace("good"), make_trace("slow", termination="timeout")],
    )
    for trace in project.traces.all():
        record_feedback(trace=trace, text="Looks fine.", reviewer=bob)
    body = b"".join(admin_api.get("/api/v1/export.jsonl", include="reviewed").streaming_content)
    assert len(body.splitlines()) == 1


@pytest.mark.parametrize(
    "stored", [{"timeout": "drop"}, {"speed": "exclude"}, "exclude", {"timeout": 1}]
)
def test_an_invalid_stored_policy_is_refused_where_it_is_used(project, stored):
    project.settings = {"data_policy": stored}
    project.save()
    with pytest.raises(ValueError):
        build_training_set(project=project)


def test_setting_the_policy_keeps_the_other_settings(project):
    project.settings = {"training": {"lora_r": 8}}
    project.save()
    set_data_policy(project=project, policy=DataPolicy(tool_error="exclude"))
    project.refresh_from_db()
    assert project.settings["training"] == {"lora_r": 8}
    assert project.settings["data_policy"]["tool_error"] == "exclude"
