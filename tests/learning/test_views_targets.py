"""The targets page: proposals grouped per feedback, each a word diff against the original
answer, and one choice per feedback."""

import pytest
from django.test import Client

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.rendering import word_diff
from tests.factories import make_trace

HX = {"HX-Request": "true"}


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _proposals(trace, text: str, replies: list[tuple[str, bool]]) -> list[DistillationTarget]:
    """Stored as the target task stores a teacher's revisions (one row per proposal)."""
    messages = trace.body_json()["messages"]
    feedback, _ = record_feedback(trace=trace, text=text, turn=4)
    return [
        DistillationTarget.objects.create(
            feedback=feedback,
            turn=4,
            source="hint",
            student_context=messages[:4],
            original=messages[4],
            target={"role": "assistant", "content": reply},
            passes_checks=passes,
        )
        for reply, passes in replies
    ]


@pytest.fixture
def three_proposals(project):
    """One feedback with three proposals, stored worst first to show the page ranks them."""
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return _proposals(
        project.traces.get(),
        "Begin with 'Answer:'.",
        [
            ("Well, the answer is 84.", False),
            ("Answer: the product of twelve and seven is eighty-four.", True),
            ("Answer: 12 * 7 is 84.", True),
        ],
    )


def _group_html(html: str, feedback_id: int) -> str:
    start = html.index(f'id="feedback-targets-{feedback_id}"')
    return html[start : html.index("</article>", start)]


def test_a_feedbacks_proposals_are_one_group_not_three_cards(bob, project, three_proposals):
    ingest_traces(project=project, raw_items=[make_trace("t-2")])
    _proposals(project.traces.get(external_id="t-2"), "Be brief.", [("84.", True)])

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    assert html.count('class="feedback-targets"') == 2
    group = _group_html(html, three_proposals[0].feedback_id)
    assert "Begin with &#x27;Answer:&#x27;." in group and "t-1 · turn 4" in group
    assert group.count('class="proposal ') == 3
    assert "2 other proposals" in group


def test_the_best_proposal_leads_and_is_shown_as_a_diff(bob, three_proposals):
    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    group = _group_html(html, three_proposals[0].feedback_id)
    # Passing, and the closest to "12 * 7 is 84.": only "Answer:" is added.
    lead = group[: group.index("other proposals")]
    assert f'id="target-{three_proposals[2].pk}"' in lead
    assert "<ins>Answer: </ins>12 * 7 is 84." in lead
    assert "<del>" not in lead
    assert group.index(f"target-{three_proposals[1].pk}") < group.index(
        f"target-{three_proposals[0].pk}"
    )  # the failing one last


def test_untrusted_text_in_a_proposal_is_escaped_in_its_diff(bob, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    _proposals(project.traces.get(), "Be brief.", [("<script>alert(1)</script> 84", True)])

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;" in html


def test_using_one_proposal_rejects_its_siblings(bob, three_proposals):
    best = three_proposals[2]
    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{best.feedback_id}/",
        {"decision": "approve", "target": best.pk},
        headers=HX,
    )

    assert response.status_code == 200
    assert f'id="feedback-targets-{best.feedback_id}"' in response.content.decode()
    states = {t.pk: (t.state, t.reviewed_by) for t in DistillationTarget.objects.all()}
    assert states == {
        three_proposals[0].pk: (TargetState.REJECTED, bob),
        three_proposals[1].pk: (TargetState.REJECTED, bob),
        best.pk: (TargetState.APPROVED, bob),
    }


def test_changing_the_choice_rejects_the_earlier_one(bob, three_proposals):
    feedback_id = three_proposals[0].feedback_id
    client = logged_in(bob)
    for target in (three_proposals[2], three_proposals[1]):
        client.post(
            f"/p/acme/targets/feedback/{feedback_id}/", {"decision": "approve", "target": target.pk}
        )
    approved = DistillationTarget.objects.filter(state=TargetState.APPROVED)
    assert list(approved.values_list("pk", flat=True)) == [three_proposals[1].pk]


def test_an_edit_is_the_choice(bob, three_proposals):
    chosen = three_proposals[1]
    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{chosen.feedback_id}/",
        {"decision": "edit", "target": chosen.pk, "text": "Answer: 84"},
    )

    assert response.status_code == 302
    chosen.refresh_from_db()
    assert (chosen.state, chosen.target) == (
        TargetState.EDITED,
        {"role": "assistant", "content": "Answer: 84"},
    )
    assert DistillationTarget.objects.filter(state=TargetState.REJECTED).count() == 2


def test_reject_all_rejects_every_proposal(bob, three_proposals):
    feedback_id = three_proposals[0].feedback_id
    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{feedback_id}/", {"decision": "reject"}, headers=HX
    )

    assert response.status_code == 200
    assert "all rejected" in response.content.decode()
    assert set(DistillationTarget.objects.values_list("state", flat=True)) == {"rejected"}


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        ({"decision": "edit", "text": " "}, "an edited target needs text"),
        ({"decision": "approve", "target": ""}, "choose one of this feedback"),
        ({"decision": "approve", "target": "x"}, "choose one of this feedback"),
        ({"decision": "maybe"}, "unknown decision"),
    ],
)
def test_a_bad_choice_is_422_naming_the_problem_and_changes_nothing(
    bob, three_proposals, form, problem
):
    target = three_proposals[1]
    form = {"target": target.pk, **form}
    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{target.feedback_id}/", form, headers=HX
    )

    assert response.status_code == 422
    assert problem in response.content.decode()
    assert set(DistillationTarget.objects.values_list("state", flat=True)) == {"proposed"}


def test_a_target_of_another_feedback_cannot_be_chosen(bob, project, three_proposals):
    ingest_traces(project=project, raw_items=[make_trace("t-2")])
    (other,) = _proposals(project.traces.get(external_id="t-2"), "Be brief.", [("84.", True)])
    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{three_proposals[0].feedback_id}/",
        {"decision": "approve", "target": other.pk},
    )

    assert response.status_code == 422
    assert set(DistillationTarget.objects.values_list("state", flat=True)) == {"proposed"}


def test_viewers_and_other_projects_cannot_choose(victor, mallory, three_proposals):
    feedback_id = three_proposals[0].feedback_id
    form = {"decision": "approve", "target": three_proposals[0].pk}
    assert (
        logged_in(victor).post(f"/p/acme/targets/feedback/{feedback_id}/", form).status_code == 403
    )
    response = logged_in(mallory).post(f"/p/globex/targets/feedback/{feedback_id}/", form)
    assert response.status_code == 404
    assert set(DistillationTarget.objects.values_list("state", flat=True)) == {"proposed"}


def test_viewers_read_the_groups_without_the_choice_buttons(victor, three_proposals):
    html = logged_in(victor).get("/p/acme/targets/").content.decode()
    assert 'class="feedback-targets"' in html
    assert "Use this one" not in html and "Reject all" not in html


def test_a_chosen_feedback_moves_from_the_proposed_tab_to_the_approved_tab(bob, three_proposals):
    feedback_id = three_proposals[0].feedback_id
    client = logged_in(bob)
    client.post(
        f"/p/acme/targets/feedback/{feedback_id}/",
        {"decision": "approve", "target": three_proposals[2].pk},
    )

    proposed = client.get("/p/acme/targets/").content.decode()
    approved = client.get("/p/acme/targets/?state=approved").content.decode()
    rejected = client.get("/p/acme/targets/?state=rejected").content.decode()

    assert f"feedback-targets-{feedback_id}" not in proposed
    assert "No proposals wait for a choice" in proposed
    assert f"feedback-targets-{feedback_id}" in approved and "in use" in approved
    assert f"feedback-targets-{feedback_id}" not in rejected  # one of them is in use


def test_an_unknown_state_is_400_naming_it(bob, three_proposals):
    response = logged_in(bob).get("/p/acme/targets/?state=maybe")
    assert response.status_code == 400
    assert "'maybe' is not one of" in response.content.decode()


def test_auto_approve_applied_to_proposals_approves_one_per_feedback(alice, three_proposals):
    feedback = three_proposals[0].feedback
    feedback.checks = [{"kind": "regex", "value": "^Answer:"}]
    feedback.save(update_fields=["checks"])

    logged_in(alice).post(
        "/p/acme/targets/policy/", {"policy": "checks_pass", "apply_to_proposed": "on"}
    )

    approved = DistillationTarget.objects.filter(state=TargetState.APPROVED)
    # The first passing one stored: the target task stores its proposals best first.
    assert list(approved.values_list("pk", flat=True)) == [three_proposals[1].pk]


def test_a_word_diff_keeps_both_texts_and_marks_the_change():
    pieces = word_diff("12 * 7 is 84.", "Answer: 12 * 7 is 84.")
    assert "".join(p.text for p in pieces if p.op != "insert") == "12 * 7 is 84."
    assert "".join(p.text for p in pieces if p.op != "delete") == "Answer: 12 * 7 is 84."
    assert [p.op for p in pieces] == ["insert", "equal"]
    replaced = word_diff("a week has 7 days", "a week has 5 days")
    assert [(p.op, p.text) for p in replaced if p.op != "equal"] == [
        ("delete", "7"),
        ("insert", "5"),
    ]


def test_a_proposal_that_changes_nothing_says_so(bob, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    _proposals(project.traces.get(), "Be brief.", [("12 * 7 is 84.", True)])
    html = logged_in(bob).get("/p/acme/targets/").content.decode()
    assert "the same as the original answer" in html
