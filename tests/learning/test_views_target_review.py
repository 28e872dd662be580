"""Judging targets on the targets page: checks as chips, rewrites beside the original, counts
on the tabs, the siblings an approval rejected, garbled proposals ranked down, and approving
every proposal that passes all its feedback's checks in one POST."""

import pytest
from django.test import Client

from reviewapp.learning.approvals import readable_diff
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.traces.rendering import word_diff
from tests.factories import feedback_with_proposals

HX = {"HX-Request": "true"}
ANSWER_CHECKS = [{"kind": "regex", "value": "^Answer:"}, {"kind": "max_words", "value": 6}]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _section(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start : html.index("</section>", start)]


def test_each_check_is_a_chip_that_passes_or_fails(bob, project):
    _, (good, wordy) = feedback_with_proposals(
        project,
        "t-1",
        ["Answer: 12 * 7 is 84.", "Well, the answer to 12 * 7 is 84."],
        checks=ANSWER_CHECKS,
    )

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    good_html, wordy_html = (
        _section(html, f"target-{good.pk}"),
        _section(html, f"target-{wordy.pk}"),
    )
    assert '<li class="pass"><span aria-hidden="true">✓</span> regex ^Answer:' in good_html
    assert '<li class="pass"><span aria-hidden="true">✓</span> max_words 6' in good_html
    assert '<li class="fail"><span aria-hidden="true">✗</span> regex ^Answer:' in wordy_html
    assert '<li class="fail"><span aria-hidden="true">✗</span> max_words 6' in wordy_html


def test_a_proposal_marked_failing_when_proposed_says_so(bob, project):
    _, (cut,) = feedback_with_proposals(
        project, "t-1", [("Answer: 12 * 7 is", False)], ANSWER_CHECKS
    )

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    assert "failed when proposed: cut off at the token limit" in _section(html, f"target-{cut.pk}")


def test_an_edit_is_a_word_diff_and_a_rewrite_sits_beside_the_original(bob, project):
    _, (edit, rewrite) = feedback_with_proposals(
        project,
        "t-1",
        ["Answer: 12 * 7 is 84.", "Multiplying twelve by seven gives eighty-four, I think."],
    )

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    edit_html, rewrite_html = (
        _section(html, f"target-{edit.pk}"),
        _section(html, f"target-{rewrite.pk}"),
    )
    assert '<pre class="diff"><ins>Answer: </ins>12 * 7 is 84.</pre>' in edit_html
    assert "side-by-side" not in edit_html
    assert 'class="diff"' not in rewrite_html
    assert "<figcaption>Original answer</figcaption><pre>12 * 7 is 84.</pre>" in rewrite_html
    assert "<pre>Multiplying twelve by seven gives eighty-four, I think.</pre>" in rewrite_html


def test_a_rewrite_shown_beside_the_original_is_escaped(bob, project):
    feedback_with_proposals(
        project, "t-1", ['<img src=x onerror="alert(1)"> Multiplied, that is 84']
    )

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    assert "<img" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html


def test_the_tabs_count_the_feedback_in_each_state(bob, project):
    feedback_with_proposals(project, "t-1", ["Answer: 84."])
    feedback_with_proposals(project, "t-2", ["Answer: 84."])
    chosen, (approved, _) = feedback_with_proposals(
        project, "t-3", ["Answer: 84.", "Answer: 12 * 7 = 84."]
    )
    turned_down, _ = feedback_with_proposals(project, "t-4", ["Hmm."])
    client = logged_in(bob)
    url = "/p/acme/targets/feedback/{}/"
    client.post(url.format(chosen.pk), {"decision": "approve", "target": approved.pk})
    client.post(url.format(turned_down.pk), {"decision": "reject"})

    html = client.get("/p/acme/targets/").content.decode()

    assert 'Proposed <span class="count">2</span>' in html
    assert 'Approved <span class="count">1</span>' in html
    assert 'Edited <span class="count">0</span>' in html
    assert 'Rejected <span class="count">1</span>' in html


def test_approving_says_how_many_sibling_proposals_it_rejected(bob, project):
    feedback, (chosen, _, _) = feedback_with_proposals(
        project, "t-1", ["Answer: 84.", "84.", "It is 84."]
    )

    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{feedback.pk}/",
        {"decision": "approve", "target": chosen.pk},
        headers=HX,
    )

    assert response.status_code == 200
    assert "Approving this rejected 2 other proposals for the same feedback" in (
        response.content.decode()
    )


def test_an_edit_says_how_many_sibling_proposals_it_rejected(bob, project):
    feedback, (chosen, _) = feedback_with_proposals(project, "t-1", ["Answer: 84.", "84."])

    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{feedback.pk}/",
        {"decision": "edit", "target": chosen.pk, "text": "Answer: 84"},
        headers=HX,
    )

    assert "Saving this edit rejected 1 other proposal for the same feedback" in (
        response.content.decode()
    )


def test_approving_without_htmx_says_it_on_the_page_it_returns_to(bob, project):
    feedback, (chosen, _) = feedback_with_proposals(project, "t-1", ["Answer: 84.", "84."])

    response = logged_in(bob).post(
        f"/p/acme/targets/feedback/{feedback.pk}/",
        {"decision": "approve", "target": chosen.pk},
        follow=True,
    )

    assert "Approving this rejected 1 other proposal for the same feedback" in (
        response.content.decode()
    )


def test_a_garbled_proposal_ranks_after_a_readable_one_passing_as_many_checks(bob, project):
    feedback, (garbled, echo, readable) = feedback_with_proposals(
        project,
        "t-1",
        [
            # The closest to "12 * 7 is 84.": the old rank put it first.
            "<tool_response>\n12 * 7 is 84.\n</tool_response>",
            "Begin with 'Answer:'.",  # the feedback repeated back
            "The product is 84.",
        ],
    )

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    group = html[html.index(f'id="feedback-targets-{feedback.pk}"') :]
    lead = group[: group.index("other proposals")]
    assert f'id="target-{readable.pk}"' in lead
    assert group.index(f'id="target-{garbled.pk}"') < group.index(f'id="target-{echo.pk}"')
    assert "looks garbled" in _section(html, f"target-{garbled.pk}")
    assert "looks garbled" in _section(html, f"target-{echo.pk}")
    assert "looks garbled" not in _section(html, f"target-{readable.pk}")


def test_a_readable_proposal_leads_a_garbled_one_passing_more_checks(bob, project):
    feedback, (readable_failing, garbled_passing) = feedback_with_proposals(
        project,
        "t-1",
        ["Well, the product is 84.", "<tool_response>Answer: 84</tool_response>"],
        checks=[{"kind": "regex", "value": "Answer:"}],
    )

    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    group = html[html.index(f'id="feedback-targets-{feedback.pk}"') :]
    assert group.index(f'id="target-{readable_failing.pk}"') < group.index(
        f'id="target-{garbled_passing.pk}"'
    )


@pytest.fixture
def mixed_feedback(project):
    """Two feedback items with a proposal passing every check, one whose proposals all fail a
    check, one with no checks at all, and one whose only passing proposal looks garbled."""
    passing, passing_targets = feedback_with_proposals(
        project, "t-1", ["Well, it is 84.", "Answer: 12 * 7 is 84.", "Answer: 84."], ANSWER_CHECKS
    )
    also, also_targets = feedback_with_proposals(project, "t-2", ["Answer: 84."], ANSWER_CHECKS)
    failing, failing_targets = feedback_with_proposals(
        project, "t-3", ["Answer: it is 84.", "It is 84."], [{"kind": "max_words", "value": 1}]
    )
    unchecked, unchecked_targets = feedback_with_proposals(project, "t-4", ["Answer: 84."])
    garbled, garbled_targets = feedback_with_proposals(
        project, "t-5", ["Answer: <tool_response>84</tool_response>"], ANSWER_CHECKS
    )
    return {
        "passing": (passing, passing_targets),
        "also": (also, also_targets),
        "failing": (failing, failing_targets),
        "unchecked": (unchecked, unchecked_targets),
        "garbled": (garbled, garbled_targets),
    }


def test_the_page_offers_to_approve_the_proposals_passing_every_check(bob, mixed_feedback):
    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    form = html[
        html.index('class="approve-passing"') : html.index(
            "</form>", html.index('class="approve-passing"')
        )
    ]
    assert "Approve the 2 proposals passing every check…" in form
    assert "Yes, approve 2" in form
    listed = {int(part.split('"')[0]) for part in form.split('name="feedback" value="')[1:]}
    assert listed == {mixed_feedback["passing"][0].pk, mixed_feedback["also"][0].pk}


def test_bulk_approve_takes_the_best_passing_proposal_of_each_and_rejects_its_siblings(
    bob, mixed_feedback
):
    ids = [feedback.pk for feedback, _ in mixed_feedback.values()]

    response = logged_in(bob).post(
        "/p/acme/targets/approve-passing/", {"feedback": ids}, follow=True
    )

    assert response.status_code == 200
    assert (
        "Approved 2 proposals passing every check; that rejected 2 other proposals for the same "
        "feedback. 3 listed had no proposal to approve" in response.content.decode()
    )
    states = dict(DistillationTarget.objects.values_list("pk", "state"))
    failing_first, best, shorter = mixed_feedback["passing"][1]
    # "Answer: 84." passes too, but "Answer: 12 * 7 is 84." is closer to the original.
    assert (states[failing_first.pk], states[best.pk], states[shorter.pk]) == (
        TargetState.REJECTED,
        TargetState.APPROVED,
        TargetState.REJECTED,
    )
    assert states[mixed_feedback["also"][1][0].pk] == TargetState.APPROVED
    for untouched in ("failing", "unchecked", "garbled"):
        assert {states[t.pk] for t in mixed_feedback[untouched][1]} == {TargetState.PROPOSED}
    assert DistillationTarget.objects.get(pk=best.pk).reviewed_by == bob


def test_bulk_approve_leaves_a_feedback_already_decided(bob, mixed_feedback):
    feedback, (_, best, other) = mixed_feedback["passing"]
    client = logged_in(bob)
    client.post(
        f"/p/acme/targets/feedback/{feedback.pk}/", {"decision": "approve", "target": other.pk}
    )

    client.post("/p/acme/targets/approve-passing/", {"feedback": [feedback.pk]})

    assert DistillationTarget.objects.get(pk=other.pk).state == TargetState.APPROVED
    assert DistillationTarget.objects.get(pk=best.pk).state == TargetState.REJECTED


@pytest.mark.parametrize("form", [{}, {"feedback": ["x"]}, {"feedback": ["1", "-2"]}])
def test_a_bulk_approve_naming_no_feedback_ids_is_400(bob, mixed_feedback, form):
    response = logged_in(bob).post("/p/acme/targets/approve-passing/", form)

    assert response.status_code == 400
    assert "list the feedback ids" in response.content.decode()
    assert set(DistillationTarget.objects.values_list("state", flat=True)) == {TargetState.PROPOSED}


def test_a_bulk_approve_is_a_post(bob, mixed_feedback):
    assert logged_in(bob).get("/p/acme/targets/approve-passing/").status_code == 405


def test_viewers_and_other_projects_cannot_bulk_approve(victor, mallory, mixed_feedback):
    ids = [feedback.pk for feedback, _ in mixed_feedback.values()]
    forbidden = logged_in(victor).post("/p/acme/targets/approve-passing/", {"feedback": ids})
    elsewhere = logged_in(mallory).post("/p/globex/targets/approve-passing/", {"feedback": ids})

    assert forbidden.status_code == 403
    assert elsewhere.status_code == 302  # its own project's page: nothing of acme's was approved
    assert set(DistillationTarget.objects.values_list("state", flat=True)) == {TargetState.PROPOSED}


def test_viewers_are_not_offered_the_bulk_approve(victor, mixed_feedback):
    html = logged_in(victor).get("/p/acme/targets/").content.decode()
    assert "approve-passing" not in html


def test_the_keys_are_listed_on_the_page(bob, mixed_feedback):
    html = logged_in(bob).get("/p/acme/targets/").content.decode()

    keys = html[
        html.index('id="target-keys"') : html.index("</dl>", html.index('id="target-keys"'))
    ]
    for key, meaning in [("a", "approve"), ("e", "edit"), ("r", "reject all"), ("j", "next")]:
        assert f"<kbd>{key}</kbd>" in keys and meaning in keys
    assert "js/targets.js" in html


def test_short_islands_between_changes_fold_into_one_removed_and_one_added_run():
    pieces = readable_diff(
        word_diff(
            "It costs 5 euros and ships in 3 days.", "It costs 7 dollars and ships in 3 days."
        )
    )

    assert [(piece.op, piece.text) for piece in pieces] == [
        ("equal", "It costs "),
        ("delete", "5 euros"),
        ("insert", "7 dollars"),
        ("equal", " and ships in 3 days."),
    ]
