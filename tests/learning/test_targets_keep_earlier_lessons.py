"""A new lesson's targets keep the team's earlier lessons: the worker's teacher (a real HTTP
server, a fake model upstream) goes on sampling past a revision that follows the new feedback
and breaks an earlier lesson, and auto-approval takes one that keeps both."""

import pytest

from reviewapp.learning.lessons import EarlierLesson, earlier_lessons, unkept_lessons
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.proposals import (
    TEACHER_BUDGET,
    TEACHER_SAMPLES_PER_ROUND,
    propose_targets_for,
)
from reviewapp.projects.project_settings import update_settings
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.factories import feedback_with_proposals, make_trace
from tests.fake_upstream import FakeUpstream

SHORT = "Keep it under 5 words."
SHORT_CHECK = {"kind": "max_words", "value": 5}
PREFIX = "Begin with 'Answer:'."
PREFIX_CHECK = {"kind": "regex", "value": "^Answer:"}
LONG_BUT_PREFIXED = "Answer: twelve times seven makes eighty four in all."


class ScriptedTeacher(FakeUpstream):
    """A FAKE teacher: each request's `n` choices are the next ones of `script`, in order."""

    def __init__(self, script: list[str]) -> None:
        super().__init__()
        self.script = script
        self.asked = 0

    def _completion(self, payload: dict) -> dict:
        count = payload.get("n") or 1
        start = self.asked * count
        self.asked += 1
        texts = [self.script[(start + i) % len(self.script)] for i in range(count)]
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "model": payload.get("model"),
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
                for i, text in enumerate(texts)
            ],
        }


@pytest.fixture
def teacher(request, project, settings):
    server = ScriptedTeacher(request.param).start()
    settings.TEACHER_SERVERS = [server.url]
    update_settings(
        project=project,
        changes={"teacher": {"url": server.url, "model": "fake"}, "auto_approve": "checks_pass"},
    )
    yield server
    server.stop()


@pytest.fixture
def traces(project):
    ingest_traces(project=project, raw_items=[make_trace("earlier"), make_trace("new")])
    return {trace.external_id: trace for trace in project.traces.all()}


def _corrected(trace, text: str, check: dict, answer: str):
    """A reviewer's corrected turn under feedback with a check: an approved target."""
    feedback, _ = record_feedback(
        trace=trace,
        text=text,
        turn=4,
        checks=[check],
        correction={"role": "assistant", "content": answer},
    )
    propose_targets_for(feedback_id=feedback.pk)
    return feedback


def _earlier_lesson_taught(traces) -> None:
    _corrected(traces["earlier"], SHORT, SHORT_CHECK, "84.")  # "under 5 words", taught first


def _new_lesson(traces):
    feedback, _ = record_feedback(trace=traces["new"], text=PREFIX, turn=4, checks=[PREFIX_CHECK])
    return feedback


@pytest.mark.parametrize(
    "teacher", [[LONG_BUT_PREFIXED, "84", "eighty-four", "It is 84.", "Answer: 84."]], indirect=True
)
def test_the_approved_target_keeps_the_earlier_lesson(project, traces, teacher):
    _earlier_lesson_taught(traces)
    feedback = _new_lesson(traces)

    propose_targets_for(feedback_id=feedback.pk)

    # The first round's one revision that begins with "Answer:" is 9 words long: the teacher
    # was asked again, and its "Answer: 84." is the one approved.
    assert teacher.asked == 2
    targets = DistillationTarget.objects.filter(feedback=feedback)
    [approved] = targets.filter(state=TargetState.APPROVED)
    assert approved.target["content"] == "Answer: 84."
    assert targets.filter(target__content=LONG_BUT_PREFIXED, state=TargetState.PROPOSED).exists()


@pytest.mark.parametrize("teacher", [[LONG_BUT_PREFIXED, "84", "It is 84."]], indirect=True)
def test_a_revision_that_follows_the_new_lesson_alone_is_still_a_target(project, traces, teacher):
    """No revision keeps both (a contradiction, or a teacher that cannot): the budget is
    spent, and the one following the feedback is approved as before."""
    _earlier_lesson_taught(traces)
    feedback = _new_lesson(traces)

    propose_targets_for(feedback_id=feedback.pk)

    assert teacher.asked == TEACHER_BUDGET // TEACHER_SAMPLES_PER_ROUND
    [approved] = DistillationTarget.objects.filter(feedback=feedback, state=TargetState.APPROVED)
    assert approved.target["content"] == LONG_BUT_PREFIXED


@pytest.mark.parametrize("teacher", [[LONG_BUT_PREFIXED, "84"]], indirect=True)
def test_without_earlier_lessons_the_first_passing_revision_ends_the_sampling(
    project, traces, teacher
):
    feedback = _new_lesson(traces)

    propose_targets_for(feedback_id=feedback.pk)

    assert teacher.asked == 1
    [approved] = DistillationTarget.objects.filter(feedback=feedback, state=TargetState.APPROVED)
    assert approved.target["content"] == LONG_BUT_PREFIXED


# Closer to the original ("12 * 7 is 84.") than "Answer: 84." is, so the teacher ranks it first.
COUNT = "Answer: 12 * 7 is 84. 1. 2. 3. 4. 5."


@pytest.mark.parametrize("teacher", [[COUNT, "Answer: 84."]], indirect=True)
def test_auto_approval_passes_over_a_revision_that_looks_garbled(project, traces, teacher):
    """A count passes "begin with 'Answer:'" as well as the answer does, and is closer to the
    original; it is left to a person, and the readable one is approved."""
    feedback = _new_lesson(traces)

    propose_targets_for(feedback_id=feedback.pk)

    targets = DistillationTarget.objects.filter(feedback=feedback)
    [approved] = targets.filter(state=TargetState.APPROVED)
    assert approved.target["content"] == "Answer: 84."
    assert targets.filter(target__content=COUNT, state=TargetState.PROPOSED).exists()


def test_earlier_lessons_are_those_given_before_other_than_the_feedbacks_own(project, traces):
    _earlier_lesson_taught(traces)
    # The new feedback's own lesson, given earlier too: not an earlier lesson of its.
    _corrected(traces["earlier"], "Begin with 'Answer:'. ", PREFIX_CHECK, "Answer: 84.")
    feedback = _new_lesson(traces)
    later = _corrected(
        traces["earlier"], "Say please.", {"kind": "regex", "value": "please"}, "84, please."
    )

    assert earlier_lessons(feedback) == [
        EarlierLesson(SHORT, [SHORT_CHECK], frozenset({"after a result"}))  # turn 4: the answer
    ]
    assert [lesson.text for lesson in earlier_lessons(later)] == [SHORT, PREFIX]


def test_an_earlier_lesson_is_judged_only_in_the_places_it_was_given_for():
    unkept = unkept_lessons([EarlierLesson(SHORT, [SHORT_CHECK], frozenset({"a reply"}))])
    question = [{"role": "user", "content": "What is 12 * 7?"}]
    long_reply = {"role": "assistant", "content": LONG_BUT_PREFIXED}
    call = {
        "role": "assistant",
        "content": LONG_BUT_PREFIXED,
        "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "calculator", "arguments": '{"expression": "12 * 7"}'}}
        ],
    }  # fmt: skip

    assert unkept(long_reply, question) == (SHORT,)
    assert unkept({"role": "assistant", "content": "Answer: 84."}, question) == ()
    assert unkept(call, question) == ()  # a tool call is another place


def test_the_targets_page_ranks_first_and_marks_what_keeps_the_earlier_lessons(
    project, traces, bob
):
    """Two proposals awaiting a reviewer, both following the new feedback; the one closer to
    the original ("12 * 7 is 84.") breaks "under 5 words", so it comes second, marked."""
    from django.test import Client

    _earlier_lesson_taught(traces)
    feedback, _ = feedback_with_proposals(
        project, "new-2", ["Answer: 12 * 7 is 84, the product.", "Answer: 84."], [PREFIX_CHECK]
    )
    client = Client()
    client.force_login(bob)

    html = client.get("/p/acme/targets/").content.decode()

    group = html[html.index(f'id="feedback-targets-{feedback.pk}"') :]
    assert group.index("Answer: 84.") < group.index("the product.")
    assert group.count("breaks an earlier lesson") == 1
    assert f"breaks an earlier lesson: “{SHORT}”" in group


def test_the_targets_api_ranks_and_names_the_earlier_lessons_a_proposal_breaks(
    project, traces, review_api
):
    """The same two proposals over the API: the one keeping "under 5 words" first, the other
    naming the lesson it breaks, as the page marks it."""
    _earlier_lesson_taught(traces)
    feedback_with_proposals(
        project, "new-2", ["Answer: 12 * 7 is 84, the product.", "Answer: 84."], [PREFIX_CHECK]
    )

    response = review_api.get("/api/v1/targets")

    assert response.status_code == 200
    [group] = [g for g in response.json()["feedback"] if g["trace"] == "new-2"]
    keeps, breaks = group["proposals"]
    assert keeps["target"]["content"] == "Answer: 84."
    assert keeps["breaks_earlier_lessons"] == []
    assert breaks["breaks_earlier_lessons"] == [SHORT]


@pytest.mark.parametrize("teacher", [["Answer: 84."]], indirect=True)
@pytest.mark.parametrize("edits", [True, False])
def test_the_teacher_is_asked_for_its_edit_of_the_answer_as_the_project_says(
    project, traces, teacher, monkeypatch, edits
):
    """training.teacher_edits reaches the teacher; this one (not vLLM: it will not tokenize)
    makes no edit, and its samples are proposed as before."""
    from training import targets

    asked = []
    real_propose = targets.propose_targets

    def propose(*args, **kwargs):
        asked.append(kwargs["edit_original"])
        return real_propose(*args, **kwargs)

    monkeypatch.setattr(targets, "propose_targets", propose)
    update_settings(project=project, changes={"training": {"teacher_edits": edits}})
    feedback = _new_lesson(traces)

    propose_targets_for(feedback_id=feedback.pk)

    assert asked == [edits]
    [approved] = DistillationTarget.objects.filter(feedback=feedback, state=TargetState.APPROVED)
    assert approved.target["content"] == "Answer: 84."
