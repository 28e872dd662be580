"""The lessons ledger: each lesson's adherence in every adapter version evaluated, written from
the evaluation's per-lesson rows; a lesson lost in the newest deployed version shows as lost,
on the adapter page, the Retrain page and GET /api/v1/lessons. And contradicting lessons,
found in the approved targets before training."""

import pytest
from django.test import Client

from reviewapp.learning.dataset import build_training_set
from reviewapp.learning.lessons import (
    contradicting_lessons,
    lesson_key,
    lesson_ledger,
    record_lessons,
    superseded_targets,
)
from reviewapp.learning.models import (
    Adapter,
    DistillationTarget,
    Lesson,
    LessonAdherence,
    ModelRoute,
    RunStatus,
    TargetState,
    TrainingRun,
)
from reviewapp.learning.plan import RunPlan
from reviewapp.learning.runs import start_retrain
from reviewapp.projects.project_settings import settings_for
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace

FRENCH = "Answer in French."
QUESTION = "End with a question."


def _version(project, version: int, status: str = RunStatus.DEPLOYED) -> Adapter:
    run = TrainingRun.objects.create(project=project, config={}, status=status)
    return Adapter.objects.create(
        project=project,
        version=version,
        name=f"{project.slug}-v{version}",
        path=f"/adapters/{project.slug}-v{version}",
        base_model=project.base_model,
        checksum="0" * 64,
        run=run,
    )


def _measured(text: str, held_out_after: float | None, *, trained_after: float = 1.0) -> dict:
    """A per_lesson row as training/evaluation.py writes it (4 trained, 4 held out)."""
    return {
        "lesson": text,
        "checks": [{"kind": "regex", "value": "x"}],
        "trained": {"fixed": 4, "still failing": 0, "regressed": 0, "still passing": 0},
        "held_out": (
            {"fixed": 4, "still failing": 0, "regressed": 0, "still passing": 0}
            if held_out_after is not None
            else {"fixed": 0, "still failing": 0, "regressed": 0, "still passing": 0}
        ),
        "trained_adherence": {"before": 0.0, "after": trained_after},
        "held_out_adherence": (
            {"before": 0.0, "after": held_out_after} if held_out_after is not None else None
        ),
    }


def _serve(project, adapter: Adapter) -> None:
    ModelRoute.objects.update_or_create(project=project, defaults={"primary": adapter.name})


def test_the_first_version_that_passes_the_gate_learns_a_lesson(project):
    v1, v2 = _version(project, 1, RunStatus.GATE_FAILED), _version(project, 2)

    record_lessons(adapter=v1, report={"per_lesson": [_measured(FRENCH, 0.5)]}, passed=False)
    record_lessons(
        adapter=v2, report={"per_lesson": [_measured(" answer  in french. ", 0.75)]}, passed=True
    )

    lesson = Lesson.objects.get()
    assert (lesson.text, lesson.key) == (FRENCH, lesson_key("answer in FRENCH."))
    assert (lesson.first_learned_by, lesson.first_learned_adherence) == (v2, 0.75)
    assert [
        (row.adapter.version, row.held_out, row.learned) for row in lesson.adherence.order_by("id")
    ] == [
        (1, 0.5, False),
        (2, 0.75, True),
    ]


def test_a_lesson_below_90_percent_of_its_first_adherence_in_the_newest_deployed_is_lost(project):
    v1, v2 = _version(project, 1), _version(project, 2)
    record_lessons(adapter=v1, report={"per_lesson": [_measured(FRENCH, 1.0)]}, passed=True)
    record_lessons(
        adapter=v2,
        report={"per_lesson": [_measured(FRENCH, 0.875), _measured(QUESTION, 1.0)]},
        passed=True,
    )
    _serve(project, v2)

    french, question = lesson_ledger(project)

    assert (french.state, french.reference, french.reference_adherence) == ("lost", v2, 0.875)
    assert french.is_lost
    assert [entry.adherence for entry in french.history] == [1.0, 0.875]
    assert question.state == "kept"


def test_at_90_percent_a_lesson_is_kept_and_with_no_held_out_items_trained_adherence_counts(
    project,
):
    v1, v2 = _version(project, 1), _version(project, 2)
    record_lessons(
        adapter=v1,
        report={"per_lesson": [_measured(FRENCH, 1.0), _measured(QUESTION, None)]},
        passed=True,
    )
    record_lessons(
        adapter=v2,
        report={
            "per_lesson": [_measured(FRENCH, 0.9), _measured(QUESTION, None, trained_after=0.5)]
        },
        passed=True,
    )

    french, question = lesson_ledger(project)  # v2 deployed last: the newest deployed

    assert french.state == "kept"
    assert (question.lesson.first_learned_adherence, question.reference_adherence) == (1.0, 0.5)
    assert question.state == "lost"


def test_a_rolled_back_route_judges_lessons_by_the_version_serving(project):
    v1, v2 = _version(project, 1), _version(project, 2)
    record_lessons(adapter=v1, report={"per_lesson": [_measured(FRENCH, 1.0)]}, passed=True)
    record_lessons(adapter=v2, report={"per_lesson": [_measured(FRENCH, 0.25)]}, passed=True)
    _serve(project, v1)

    [french] = lesson_ledger(project)

    assert (french.reference, french.state) == (v1, "kept")


def test_a_lesson_no_version_learned_is_not_learned(project):
    v1 = _version(project, 1, RunStatus.GATE_FAILED)
    record_lessons(adapter=v1, report={"per_lesson": [_measured(FRENCH, 0.0)]}, passed=False)

    [french] = lesson_ledger(project)

    assert french.state == "not learned"
    assert LessonAdherence.objects.get().learned is False


def _superseded(text: str, before: float, after: float) -> dict:
    """A per_lesson row of a lesson whose every target a later lesson superseded: no item
    trained, its 4 items evaluated as held out."""
    return {
        **_measured(text, after),
        "trained": {"fixed": 0, "still failing": 0, "regressed": 0, "still passing": 0},
        "trained_adherence": None,
        "held_out_adherence": {"before": before, "after": after},
    }


@pytest.mark.parametrize(
    ("before", "after", "state"),
    [(0.0, 1.0, "kept"), (0.5, 0.5, "not learned"), (0.5, 0.25, "not learned")],
)
def test_a_lesson_carried_by_a_later_lessons_targets_is_learned_where_it_is_followed_better(
    project, before, after, state
):
    """ "Answer:" given, then "Hope this helps." before the retrain: every "Answer:" target is
    superseded, and a candidate the ending's targets taught both learned both; one that follows
    the superseded lesson no better than what served (a contradicting pair's earlier side)
    learned nothing of it."""
    v1 = _version(project, 1)
    _serve(project, v1)
    record_lessons(
        adapter=v1, report={"per_lesson": [_superseded(FRENCH, before, after)]}, passed=True
    )

    [french] = lesson_ledger(project)

    assert french.state == state
    assert french.lesson.first_learned_adherence == (after if state == "kept" else None)


def test_another_projects_lessons_stay_in_their_ledger(project, other_project):
    record_lessons(
        adapter=_version(other_project, 1),
        report={"per_lesson": [_measured(FRENCH, 1.0)]},
        passed=True,
    )
    record_lessons(
        adapter=_version(project, 1), report={"per_lesson": [_measured(FRENCH, 0.5)]}, passed=True
    )

    assert [row.lesson.first_learned_adherence for row in lesson_ledger(project)] == [0.5]
    assert Lesson.objects.count() == 2


@pytest.fixture
def lost_lesson(project):
    """v1 learned French (1.0), v2 serves and follows it at 0.5."""
    v1, v2 = _version(project, 1), _version(project, 2)
    record_lessons(adapter=v1, report={"per_lesson": [_measured(FRENCH, 1.0)]}, passed=True)
    record_lessons(adapter=v2, report={"per_lesson": [_measured(FRENCH, 0.5)]}, passed=True)
    _serve(project, v2)
    return v2


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_it_shows_the_ledger_on_the_adapter_page(alice, project, lost_lesson):
    page = _logged_in(alice).get(f"/p/{project.slug}/adapters/{lost_lesson.version}/")

    body = page.content.decode()
    assert page.status_code == 200
    assert 'id="lessons-ledger"' in body
    assert FRENCH in body
    assert "v1 1.00 · <strong>v2 0.50</strong>" in body
    assert "lesson-lost" in body


def test_it_shows_the_ledger_on_the_retrain_page(alice, project, lost_lesson):
    page = _logged_in(alice).get(f"/p/{project.slug}/retrain/")

    body = page.content.decode()
    assert page.status_code == 200
    assert 'id="lessons-ledger"' in body and "lesson-lost" in body


def test_another_projects_member_cannot_see_the_ledger(mallory, project, lost_lesson):
    client = _logged_in(mallory)

    assert client.get(f"/p/{project.slug}/adapters/{lost_lesson.version}/").status_code == 404
    assert client.get(f"/p/{project.slug}/retrain/").status_code == 404


def test_the_api_lists_the_ledger(admin_api, project, lost_lesson):
    response = admin_api.get("/api/v1/lessons")

    assert response.status_code == 200
    [lesson] = response.json()["lessons"]
    assert lesson["text"] == FRENCH
    assert (lesson["first_learned_by"], lesson["first_learned_adherence"]) == ("acme-v1", 1.0)
    assert (lesson["newest_deployed"], lesson["newest_deployed_adherence"]) == ("acme-v2", 0.5)
    assert lesson["state"] == "lost"
    assert [(v["version"], v["held_out"], v["held_out_items"]) for v in lesson["versions"]] == [
        (1, 1.0, 4),
        (2, 0.5, 4),
    ]


def test_the_api_ledger_needs_the_admin_scope(api, project, lost_lesson):
    response = api.get("/api/v1/lessons")

    assert response.status_code == 403


def test_another_projects_key_sees_its_own_empty_ledger(other_admin_api, project, lost_lesson):
    response = other_admin_api.get("/api/v1/lessons")

    assert (response.status_code, response.json()) == (200, {"lessons": []})


def test_the_lessons_route_is_in_the_openapi_document(admin_api):
    document = admin_api.get("/api/v1/openapi.json").json()

    assert "LessonListOut" in document["components"]["schemas"]
    assert any(path.endswith("/lessons") for path in document["paths"])


def _approved(
    project, external_id: str, text: str, checks: list, reply: str | dict, *, messages=None
):
    """An approved target for the last turn of `messages` (default: make_trace's, whose last
    turn answers after the calculator's result); `reply` its words, or a whole message."""
    trace_body = make_trace(external_id, **({"messages": messages} if messages else {}))
    ingest_traces(project=project, raw_items=[trace_body])
    trace = project.traces.get(external_id=external_id)
    turn = len(trace_body["messages"]) - 1
    feedback, _ = record_feedback(trace=trace, text=text, turn=turn, checks=checks)
    return DistillationTarget.objects.create(
        feedback=feedback,
        turn=turn,
        source="correction",
        student_context=trace_body["messages"][:turn],
        target=reply if isinstance(reply, dict) else {"role": "assistant", "content": reply},
        state=TargetState.APPROVED,
    )


CALL = {
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "12*7"}'},
}
CALCULATOR = ("Call the calculator.", [{"kind": "calls_tool", "value": "calculator"}])


ONE_WORD = ("Answer in one word.", [{"kind": "max_words", "value": 1}])
STEPS = ("Explain your reasoning step by step.", [{"kind": "regex", "value": "(?i)step 1"}])


@pytest.fixture
def contradicting(project):
    """One-word answers against step-by-step ones, and a third lesson both can follow."""
    return [
        _approved(project, "t-1", *ONE_WORD, "84."),
        _approved(project, "t-2", *STEPS, "Step 1: 6 times 14. Step 2: that is 84."),
        _approved(project, "t-3", "No emoji.", [{"kind": "not_regex", "value": "🙂"}], "84."),
    ]


def test_lessons_whose_targets_fail_each_others_checks_are_found_naming_the_items(
    contradicting,
):
    [conflict] = contradicting_lessons(contradicting)

    assert (conflict["lesson"], conflict["other"], conflict["count"]) == (
        ONE_WORD[0],
        STEPS[0],
        2,
    )
    assert [(item["trace"], item["of"], item["fails"]) for item in conflict["items"]] == [
        ("t-1", ONE_WORD[0], "regex (?i)step 1"),
        ("t-2", STEPS[0], "max_words 1"),
    ]


def test_a_target_failing_its_own_checks_is_no_evidence_of_a_conflict(project):
    """Counted, "Eighty four." (two words) would fail the steps check too: a conflict both ways."""
    one_word = _approved(project, "t-1", *ONE_WORD, "Eighty four.")
    steps = _approved(project, "t-2", *STEPS, "Step 1: 6 times 14. Step 2: that is 84.")

    assert contradicting_lessons([one_word, steps]) == []


def test_after_the_users_message_a_tool_call_and_a_reply_are_different_places(project):
    """The call fails the steps regex and the steps reply calls no tool, but whether to call
    depends on what was asked: neither lesson's checks were given for the other's place."""
    steps = _approved(project, "t-1", *STEPS, "Step 1: 6 times 14. Step 2: that is 84.")
    tool_call = _approved(project, "t-2", *CALCULATOR, "84.")
    tool_call.target = {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "c"}]}
    for target in (steps, tool_call):
        target.student_context = target.student_context[:2]  # the system prompt, the question
        target.save()

    assert contradicting_lessons([steps, tool_call]) == []


def test_after_a_tool_result_a_tool_call_and_a_reply_are_one_place(project):
    """Once the calculator answered, "call it" and "explain step by step" say what to do next."""
    steps = _approved(project, "t-1", *STEPS, "Step 1: 6 times 14. Step 2: that is 84.")
    tool_call = _approved(project, "t-2", *CALCULATOR, "84.")
    tool_call.target = {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "c"}]}
    tool_call.save()

    [conflict] = contradicting_lessons([steps, tool_call])

    assert conflict["count"] == 2


def _after_failures(project, external_id: str, failures: int, text: str, checks, target):
    """An approved target for the turn after `failures` failed calculator calls in a row."""
    messages = [{"role": "user", "content": "What is 12 * 7?"}]
    for number in range(failures):
        call = {**CALL, "id": f"c{number}"}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "Error: unavailable"},
        ]
    messages.append({"role": "assistant", "content": "84."})
    return _approved(project, external_id, text, checks, target, messages=messages)


RETRY = (
    "When a tool call fails, call it again once.",
    [{"kind": "calls_tool", "value": "calculator"}],
)
HONEST = (
    "When the tool keeps failing, say you could not check.",
    [{"kind": "regex", "value": "could not"}],
)
CALL_AGAIN = {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "c9"}]}
COULD_NOT = {"role": "assistant", "content": "Sorry, I could not check that."}


def test_after_a_failed_call_a_reply_and_a_call_are_one_place(project):
    """After a failure, "call again" and "say you could not check" answer one question: what to
    do next. Given for the same place, they contradict, and the later word is trained."""
    honest = _after_failures(project, "t-1", 1, *HONEST, COULD_NOT)
    retry = _after_failures(project, "t-2", 1, *RETRY, CALL_AGAIN)

    [conflict] = contradicting_lessons([honest, retry])

    assert (conflict["lesson"], conflict["other"], conflict["count"]) == (HONEST[0], RETRY[0], 2)
    assert [item["fails"] for item in conflict["items"]] == [
        "calls_tool calculator",
        "regex could not",
    ]
    assert superseded_targets([honest, retry]) == {honest.pk}


def test_after_one_failure_and_after_two_are_different_places(project):
    """Retry once, then give up honestly: the two lessons agree."""
    retry = _after_failures(project, "t-1", 1, *RETRY, CALL_AGAIN)
    honest = _after_failures(project, "t-2", 2, *HONEST, COULD_NOT)

    assert contradicting_lessons([retry, honest]) == []
    assert superseded_targets([retry, honest]) == set()


def test_the_run_plan_freezes_the_conflicts_and_the_retrain_page_shows_them(
    alice, project, contradicting
):
    page = _logged_in(alice).get(f"/p/{project.slug}/retrain/")
    run = start_retrain(project=project)

    body = page.content.decode()
    assert 'id="lesson-conflicts"' in body
    assert "Training is still allowed" in body
    assert '"Answer in one word." and "Explain your reasoning step by step.": 2 items' in body
    assert ">t-1</a> (target" in body and ">t-2</a> (target" in body
    [conflict] = run.plan["conflicts"]
    assert [item["trace"] for item in conflict["items"]] == ["t-1", "t-2"]
    plan = RunPlan.model_validate(run.plan)
    assert plan.conflicts[0].count == 2
    assert (
        RunPlan.from_settings(project=project, project_settings=settings_for(project)).conflicts
        == ()
    )


NO_EMOJI = ("No emoji.", [{"kind": "not_regex", "value": "🙂"}])
PREFIX = ("Begin with 'Answer:'.", [{"kind": "regex", "value": "^Answer:"}])


def test_an_earlier_lessons_target_failing_a_later_lessons_checks_is_superseded(project):
    """ "84." was written before the team asked for 'Answer:': trained beside the new lesson's
    targets it would teach against it. The new lesson's targets follow the old one."""
    earlier = _approved(project, "t-1", *NO_EMOJI, "84.")
    later = _approved(project, "t-2", *PREFIX, "Answer: 84.")

    assert superseded_targets([earlier, later]) == {earlier.pk}


def test_a_later_lessons_target_is_never_superseded_by_an_earlier_lesson(project):
    earlier = _approved(project, "t-1", *PREFIX, "Answer: 84.")
    later = _approved(project, "t-2", *NO_EMOJI, "84.")  # fails the earlier 'Answer:' check

    assert superseded_targets([earlier, later]) == set()


def test_of_contradicting_lessons_the_later_is_trained_and_the_pair_still_reported(
    project, contradicting
):
    one_word, steps, _ = contradicting

    run = start_retrain(project=project)

    assert superseded_targets(contradicting) == {one_word.pk}
    assert steps.pk in run.data_split["train_target_ids"]
    assert one_word.pk not in run.data_split["train_target_ids"]
    [conflict] = run.plan["conflicts"]
    assert (conflict["lesson"], conflict["other"]) == (ONE_WORD[0], STEPS[0])


def test_a_superseded_target_is_not_trained_but_evaluated_as_what_the_serving_model_keeps(
    project,
):
    earlier = _approved(project, "t-1", *NO_EMOJI, "84.")
    later = _approved(project, "t-2", *PREFIX, "Answer: 84.")

    training_set = build_training_set(project=project)
    run = start_retrain(project=project)

    assert training_set.targets == [later]
    assert training_set.excluded["superseded"] == 1
    assert run.data_split["train_target_ids"] == [later.pk]
    assert run.data_split["held_out_feedback_ids"] == [earlier.feedback_id]
    assert set(run.targets.values_list("pk", flat=True)) == {earlier.pk, later.pk}
