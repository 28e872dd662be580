"""Undo on the targets page: a feedback's choice (an approval, an edit, reject all) is reopened
for choosing again, unless a training run has used it; only reviewers of its project may."""

from django.test import Client

from reviewapp.learning.models import DistillationTarget, TargetState, TrainingRun
from tests.factories import feedback_with_proposals

HX = {"HX-Request": "true"}


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _choose(client: Client, feedback, **choice):
    return client.post(f"/p/acme/targets/feedback/{feedback.pk}/", choice, headers=HX)


def _states(targets) -> list[str]:
    return [DistillationTarget.objects.get(pk=target.pk).state for target in targets]


def test_an_approval_is_undone_and_every_proposal_is_proposed_again(bob, project):
    feedback, targets = feedback_with_proposals(project, "t-1", ["Answer: 84.", "84.", "It is."])
    bob_client = logged_in(bob)
    html = _choose(bob_client, feedback, decision="approve", target=targets[0].pk).content.decode()
    assert 'value="reopen"' in html  # the chosen feedback offers its undo

    response = _choose(bob_client, feedback, decision="reopen")

    assert response.status_code == 200
    assert _states(targets) == [TargetState.PROPOSED] * 3
    html = response.content.decode()
    assert "to choose" in html and 'value="reopen"' not in html


def test_reject_all_is_undone(bob, project):
    feedback, targets = feedback_with_proposals(project, "t-1", ["84.", "It is."])
    bob_client = logged_in(bob)
    _choose(bob_client, feedback, decision="reject")

    _choose(bob_client, feedback, decision="reopen")

    assert _states(targets) == [TargetState.PROPOSED] * 2


def test_an_undone_edit_keeps_its_text_as_a_proposal(bob, project):
    feedback, (edited, _) = feedback_with_proposals(project, "t-1", ["Answer: 84.", "84."])
    bob_client = logged_in(bob)
    _choose(bob_client, feedback, decision="edit", target=edited.pk, text="Answer: 84")

    _choose(bob_client, feedback, decision="reopen")

    edited.refresh_from_db()
    assert (edited.state, edited.target["content"]) == (TargetState.PROPOSED, "Answer: 84")


def test_a_choice_a_run_trained_on_is_not_undone(bob, project):
    feedback, (chosen, sibling) = feedback_with_proposals(project, "t-1", ["Answer: 84.", "84."])
    _choose(logged_in(bob), feedback, decision="approve", target=chosen.pk)
    TrainingRun.objects.create(project=project, config={}).targets.add(chosen)

    response = _choose(logged_in(bob), feedback, decision="reopen")

    assert response.status_code == 409
    assert "a training run has used this choice" in response.content.decode()
    assert _states([chosen, sibling]) == [TargetState.APPROVED, TargetState.REJECTED]


def test_viewers_and_other_projects_cannot_undo(victor, mallory, bob, project):
    feedback, (chosen, _) = feedback_with_proposals(project, "t-1", ["Answer: 84.", "84."])
    _choose(logged_in(bob), feedback, decision="approve", target=chosen.pk)

    forbidden = _choose(logged_in(victor), feedback, decision="reopen")
    elsewhere = logged_in(mallory).post(
        f"/p/globex/targets/feedback/{feedback.pk}/", {"decision": "reopen"}, headers=HX
    )

    assert forbidden.status_code == 403
    assert elsewhere.status_code == 404
    assert _states([chosen]) == [TargetState.APPROVED]
