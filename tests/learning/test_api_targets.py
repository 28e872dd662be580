"""Distillation targets over the API: list them by feedback, approve, edit or reject, under
review-scoped keys."""

import pytest

from reviewapp.api.app import api as ninja_api
from reviewapp.learning.models import DistillationTarget, TargetState, TrainingRun
from reviewapp.projects.services import create_api_key
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.factories import ApiClient, make_trace

TARGET_ROUTES = [
    ("get", "/api/v1/targets"),
    ("post", "/api/v1/targets/{target_id}/approve"),
    ("post", "/api/v1/targets/{target_id}/edit"),
    ("post", "/api/v1/targets/{target_id}/reject"),
    ("post", "/api/v1/targets/{target_id}/reopen"),
]


@pytest.fixture
def stored(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get(external_id="t-1")


@pytest.mark.parametrize(("method", "path"), TARGET_ROUTES)
def test_the_harness_key_is_refused_every_target_route_naming_the_scope(api, method, path):
    url = path.format(target_id=1)
    response = getattr(api, method)(url, **({} if method == "get" else {"payload": {}}))
    assert response.status_code == 403
    assert response.json()["error"] == "insufficient_scope"
    assert "'review'" in response.json()["detail"]


def test_target_routes_are_in_the_openapi_document():
    paths = ninja_api.get_openapi_schema()["paths"]
    for method, path in TARGET_ROUTES:
        assert method in paths[path], path


def proposals(trace, texts, *, text="Lead with the number."):
    """Teacher revisions of turn 4 for one feedback, in the order the teacher proposed them."""
    feedback, _ = record_feedback(trace=trace, text=text, turn=4)
    return [
        DistillationTarget.objects.create(
            feedback=feedback,
            turn=4,
            source="hint",
            student_context=trace.body_json()["messages"][:4],
            original={"role": "assistant", "content": "12 * 7 is 84."},
            target={"role": "assistant", "content": content},
        )
        for content in texts
    ]


def states(targets) -> list[str]:
    return [DistillationTarget.objects.get(pk=target.pk).state for target in targets]


def test_proposed_targets_are_listed_by_feedback_best_first(review_api, stored):
    worse, better = proposals(stored, ["Well, it is 84.", "84."])
    DistillationTarget.objects.filter(pk=worse.pk).update(passes_checks=False)
    response = review_api.get("/api/v1/targets")
    assert response.status_code == 200
    [group] = response.json()["feedback"]
    assert group["trace"] == "t-1"
    assert group["turn"] == 4
    assert group["feedback"] == "Lead with the number."
    assert group["chosen"] is None
    assert [p["id"] for p in group["proposals"]] == [better.pk, worse.pk]
    assert group["proposals"][0]["target"] == {"role": "assistant", "content": "84."}
    assert group["proposals"][0]["original"]["content"] == "12 * 7 is 84."
    assert response.json()["next"] is None


def test_the_target_list_pages_with_a_cursor(review_api, stored):
    for number in range(3):
        proposals(stored, ["84."], text=f"Lead with the number ({number}).")
    first = review_api.get("/api/v1/targets", limit=2).json()
    assert len(first["feedback"]) == 2
    second = review_api.get("/api/v1/targets", limit=2, cursor=first["next"]).json()
    assert len(second["feedback"]) == 1 and second["next"] is None
    seen = [group["feedback_id"] for group in first["feedback"] + second["feedback"]]
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == 3


def test_an_unknown_state_is_422_naming_it(review_api, stored):
    response = review_api.get("/api/v1/targets", state="maybe")
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"
    assert "state" in response.json()["detail"]


def test_a_forged_cursor_is_400(review_api, stored):
    response = review_api.get("/api/v1/targets", cursor="not-ours")
    assert response.status_code == 400
    assert "cursor" in response.json()["detail"]


def test_approving_a_proposal_rejects_its_siblings(review_api, stored):
    first, second = proposals(stored, ["84.", "It is 84."])
    response = review_api.post(f"/api/v1/targets/{second.pk}/approve", {})
    assert response.status_code == 200
    assert response.json()["chosen"] == second.pk
    assert states([first, second]) == [TargetState.REJECTED, TargetState.APPROVED]
    assert review_api.get("/api/v1/targets").json()["feedback"] == []
    [approved] = review_api.get("/api/v1/targets", state="approved").json()["feedback"]
    assert approved["chosen"] == second.pk


def test_editing_a_proposal_stores_the_new_text_as_edited(review_api, stored):
    [target] = proposals(stored, ["Well, 84."])
    response = review_api.post(f"/api/v1/targets/{target.pk}/edit", {"content": "84."})
    assert response.status_code == 200
    target.refresh_from_db()
    assert target.state == TargetState.EDITED
    assert target.target == {"role": "assistant", "content": "84."}
    assert target.reviewed_by is None  # a key is no person


@pytest.mark.parametrize(
    ("payload", "named"),
    [({}, "content"), ({"content": "   "}, "blank"), ({"content": "a\x00b"}, "NUL")],
)
def test_an_edit_without_usable_text_is_422_naming_the_problem(review_api, stored, payload, named):
    [target] = proposals(stored, ["Well, 84."])
    response = review_api.post(f"/api/v1/targets/{target.pk}/edit", payload)
    assert response.status_code == 422
    assert named in response.json()["detail"]
    assert states([target]) == [TargetState.PROPOSED]


def test_rejecting_one_proposal_leaves_the_others_to_choose_from(review_api, stored):
    first, second = proposals(stored, ["Well, 84.", "84."])
    response = review_api.post(f"/api/v1/targets/{first.pk}/reject", {})
    assert response.status_code == 200
    assert states([first, second]) == [TargetState.REJECTED, TargetState.PROPOSED]
    assert response.json()["chosen"] is None
    review_api.post(f"/api/v1/targets/{second.pk}/reject", {})
    [rejected] = review_api.get("/api/v1/targets", state="rejected").json()["feedback"]
    assert {p["state"] for p in rejected["proposals"]} == {"rejected"}


def test_reopening_undoes_the_choice_until_a_run_trains_on_it(review_api, stored, project):
    first, second = proposals(stored, ["84.", "It is 84."])
    review_api.post(f"/api/v1/targets/{second.pk}/approve", {})

    response = review_api.post(f"/api/v1/targets/{first.pk}/reopen", {})

    assert response.status_code == 200 and response.json()["chosen"] is None
    assert states([first, second]) == [TargetState.PROPOSED, TargetState.PROPOSED]
    review_api.post(f"/api/v1/targets/{second.pk}/approve", {})
    TrainingRun.objects.create(project=project, config={}).targets.add(second)
    locked = review_api.post(f"/api/v1/targets/{second.pk}/reopen", {})
    assert locked.status_code == 409
    assert "a training run has used this choice" in locked.json()["detail"]
    assert states([first, second]) == [TargetState.REJECTED, TargetState.APPROVED]


@pytest.mark.parametrize("action", ["approve", "reject", "edit", "reopen"])
def test_an_unknown_target_is_404(review_api, stored, action):
    response = review_api.post(f"/api/v1/targets/999999/{action}", {"content": "84."})
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": "no target 999999 in this project"}


@pytest.mark.parametrize("action", ["approve", "reject", "edit", "reopen"])
def test_another_projects_target_is_404_and_unchanged(stored, other_project, action):
    [target] = proposals(stored, ["84."])
    globex = ApiClient(create_api_key(project=other_project, scopes=["review"])[1])
    response = globex.post(f"/api/v1/targets/{target.pk}/{action}", {"content": "x"})
    assert response.status_code == 404
    assert states([target]) == [TargetState.PROPOSED]
    assert globex.get("/api/v1/targets").json()["feedback"] == []
