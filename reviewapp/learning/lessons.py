"""The lessons ledger: every lesson a project's feedback teaches (feedback grouped by its text)
and how well each adapter version evaluated since follows it.

Written when a run's evaluation is recorded (learning/retrain.py), from the report's
`per_lesson` rows (training/evaluation.py). A lesson is learned by the first version trained
on it that passed the gate (or, where a later lesson superseded all its targets, the first
that passed the gate following it better than what served); it is lost when the newest
deployed version (the one serving, else the newest whose run deployed) follows it less than
LOST_BELOW of what it did then.

Before training, `contradicting_lessons` lists lessons whose approved targets fail each other's
checks; a run's plan freezes them and the Retrain page shows them (training is not refused).
`superseded_targets` names the targets a lesson given later supersedes (learning/dataset.py
leaves them out of training and has them evaluated); `earlier_lessons` are what a new lesson's
targets should keep (learning/proposals.py prefers revisions that do).
"""

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from django.db import transaction

from reviewapp.learning.models import (
    Adapter,
    DistillationTarget,
    Lesson,
    LessonAdherence,
    ModelRoute,
    RunStatus,
    TargetState,
)
from reviewapp.projects.models import Project
from reviewapp.review.models import Feedback
from training.checks import check_reply, passes_every_check, tool_result_failed
from training.eval_sets import feedback_kind

# The bar for keeping a lesson: at least 90% of the adherence it had when first learned.
LOST_BELOW = 0.9
# Items named per conflicting pair of lessons; its count says how many there are in all.
MAX_CONFLICT_ITEMS = 5

LessonState = Literal["kept", "lost", "not learned", "not measured"]


def lesson_key(text: str) -> str:
    """The ledger's key for a feedback text: the same for texts differing in case or spacing."""
    return hashlib.sha256(feedback_kind(text).encode()).hexdigest()


@transaction.atomic
def record_lessons(*, adapter: Adapter, report: dict, passed: bool) -> list[LessonAdherence]:
    """One adherence row per lesson the adapter's evaluation measured; a lesson it trained on
    (or whose superseded items it follows better than what served) and passed the gate with is
    learned, and the first such version is kept on the lesson."""
    rows = []
    for measured in report.get("per_lesson") or []:
        text = " ".join((measured.get("lesson") or "").split())
        if not text:
            continue
        lesson, _ = Lesson.objects.select_for_update().get_or_create(
            project_id=adapter.project_id,
            key=lesson_key(text),
            defaults={"text": text, "checks": measured.get("checks") or []},
        )
        trained_items = sum((measured.get("trained") or {}).values())
        row, _ = LessonAdherence.objects.update_or_create(
            lesson=lesson,
            adapter=adapter,
            defaults={
                "held_out": _after(measured.get("held_out_adherence")),
                "trained": _after(measured.get("trained_adherence")),
                "held_out_items": sum((measured.get("held_out") or {}).values()),
                "trained_items": trained_items,
                "learned": passed and (trained_items > 0 or _taught_by_later_targets(measured)),
            },
        )
        if row.learned and lesson.first_learned_by_id is None:
            lesson.first_learned_by = adapter
            lesson.first_learned_adherence = row.adherence
            lesson.save(update_fields=["first_learned_by", "first_learned_adherence"])
        rows.append(row)
    return rows


def _after(rates: dict | None) -> float | None:
    return rates["after"] if rates else None


def _taught_by_later_targets(measured: dict) -> bool:
    """A lesson a run trained no item of (every target superseded by a later lesson's, see
    superseded_targets) that the candidate follows better than what served: the later
    lesson's targets carried it ("Answer:" given, then "Hope this helps." before a retrain:
    the ending's targets begin with "Answer:" too, and the candidate followed both on every
    held-out item). One the candidate follows no better was not taught (a contradicting
    pair's earlier lesson)."""
    rates = measured.get("held_out_adherence")
    return bool(rates) and rates["after"] > rates["before"]


@dataclass(frozen=True)
class LedgerRow:
    lesson: Lesson
    history: list[LessonAdherence]  # one per version evaluated, oldest first
    reference: Adapter | None  # the newest deployed version
    reference_adherence: float | None
    state: LessonState

    @property
    def is_lost(self) -> bool:
        return self.state == "lost"


def newest_deployed(project: Project) -> Adapter | None:
    """The version serving the project's primary route, else the newest whose run deployed."""
    primary = ModelRoute.objects.filter(project=project).values_list("primary", flat=True).first()
    serving = Adapter.objects.filter(project=project, name=primary).first() if primary else None
    if serving is not None:
        return serving
    return (
        Adapter.objects.filter(project=project, run__status=RunStatus.DEPLOYED)
        .order_by("-version")
        .first()
    )


def lesson_ledger(project: Project) -> list[LedgerRow]:
    """Every lesson of the project, oldest first, with its history and whether it is kept."""
    reference = newest_deployed(project)
    lessons = list(
        Lesson.objects.filter(project=project).select_related("first_learned_by").order_by("id")
    )
    history: dict[int, list[LessonAdherence]] = {lesson.pk: [] for lesson in lessons}
    for row in (
        LessonAdherence.objects.filter(lesson__project=project)
        .select_related("adapter")
        .order_by("adapter__version")
    ):
        history[row.lesson_id].append(row)
    ledger = []
    for lesson in lessons:
        rows = history[lesson.pk]
        at_reference = next(
            (row for row in rows if reference and row.adapter_id == reference.pk), None
        )
        adherence = at_reference.adherence if at_reference else None
        ledger.append(
            LedgerRow(
                lesson=lesson,
                history=rows,
                reference=reference,
                reference_adherence=adherence,
                state=_state(lesson, adherence),
            )
        )
    return ledger


def _state(lesson: Lesson, adherence: float | None) -> LessonState:
    if lesson.first_learned_by_id is None:
        return "not learned"
    if adherence is None or lesson.first_learned_adherence is None:
        return "not measured"
    lost = adherence < LOST_BELOW * lesson.first_learned_adherence - 1e-9
    return "lost" if lost else "kept"


def contradicting_lessons(targets: Sequence[DistillationTarget]) -> list[dict]:
    """Pairs of lessons where an approved target of one, passing its own feedback's checks,
    fails the other lesson's checks in a place both were given for (see _place), both ways:
    training on both would average them (the earlier lesson's targets are superseded, see
    superseded_targets, and the team should know). Each pair names up to MAX_CONFLICT_ITEMS
    targets and counts them all. Plain dicts, ready to freeze in a run's plan."""
    conflicts = []
    for first, second, one_way, other_way in _lesson_pairs(_lessons_of(targets)):
        items = [*one_way, *other_way]
        if one_way and other_way:
            conflicts.append(
                {
                    "lesson": first["text"],
                    "other": second["text"],
                    "count": len(items),
                    "items": items[:MAX_CONFLICT_ITEMS],
                }
            )
    return conflicts


def superseded_targets(targets: Sequence[DistillationTarget]) -> set[int]:
    """The ids of targets that fail the checks of a lesson given after their own.

    A team's lessons pile up: "no 'very'" is written in March, "begin with 'Answer:'" in May,
    and March's targets, which begin otherwise, would teach against May's lesson on the same
    kind of item. Trained together, the new lesson was lost under greedy decoding ('Answer:'
    followed on 0.00 of held-out questions beside two earlier lessons' targets, 0.94 when those
    targets began with it too: bench/README.md). So an earlier target the later lesson's checks
    fail is left out; what it taught stays in the serving adapter a retrain starts from
    (TrainingConfig.start_from) and the gate checks it is kept. A lesson's place is its first
    feedback's. Pairs that fail each other's checks both ways are no exception: the teacher's
    targets for a new lesson follow that lesson alone, so compatible lessons look like that too;
    for a true contradiction the team's later word is trained, never an average of both, and
    the pair is still reported (contradicting_lessons, over every usable target).
    """
    lessons = _lessons_of(targets)
    superseded: set[int] = set()
    for first, second, one_way, other_way in _lesson_pairs(lessons):
        # The earlier lesson's targets that fail the later one's checks.
        failing = one_way if first["given"] < second["given"] else other_way
        superseded |= {item["target_id"] for item in failing}
    return superseded


@dataclass(frozen=True)
class EarlierLesson:
    """A lesson given before some feedback: what a target for that feedback should keep."""

    text: str
    checks: list[dict]
    places: frozenset[str]  # where its approved targets are (see _place)


@dataclass(frozen=True)
class GivenLesson:
    lesson: EarlierLesson
    kind: str  # feedback_kind of its text
    given: int  # its first feedback's id


def lessons_given(project_id: int) -> list[GivenLesson]:
    """The project's lessons (feedback with checks, grouped by kind) that have approved
    targets, each with the places those are in and when it was first given."""
    targets = (
        DistillationTarget.objects.filter(
            feedback__trace__project_id=project_id, state=TargetState.APPROVED
        )
        .select_related("feedback")
        .defer("teacher_context", "original")  # a place needs the context and the reply only
    )
    return [
        GivenLesson(
            EarlierLesson(lesson["text"], lesson["checks"], frozenset(lesson["places"].values())),
            kind,
            lesson["given"],
        )
        for kind, lesson in _lessons_of(targets, judged=False).items()
    ]


def earlier_lessons(
    feedback: Feedback, given: Sequence[GivenLesson] | None = None
) -> list[EarlierLesson]:
    """The lessons first given before `feedback`, other than its own (`given`: the project's
    lessons_given, when the caller has them already)."""
    if given is None:
        given = lessons_given(feedback.trace.project_id)
    own = feedback_kind(feedback.text)
    return [item.lesson for item in given if item.given < feedback.pk and item.kind != own]


# (reply, the messages before it) -> the texts of the earlier lessons the reply does not follow.
UnkeptLessons = Callable[[dict, list[dict]], tuple[str, ...]]


def unkept_lessons(lessons: Sequence[EarlierLesson]) -> UnkeptLessons:
    """For propose_targets: the texts of `lessons` a revision fails, each judged only in the
    places it was given for (a lesson about replies says nothing about tool calls)."""

    def unkept(message: dict, context: list[dict]) -> tuple[str, ...]:
        place = _place_of(context, message)
        return tuple(
            lesson.text
            for lesson in lessons
            if place in lesson.places
            and not passes_every_check(lesson.checks, message, context=context)
        )

    return unkept


def _lessons_of(targets: Sequence[DistillationTarget], judged: bool = True) -> dict[str, dict]:
    """Each lesson (feedback with checks, grouped by kind) with its targets, those of them that
    pass its own checks and each target's place (both judged once here, not once per other
    lesson) and when it was first given (its first feedback's id). `judged=False` leaves
    `passing` empty: earlier_lessons needs no target's checks run, and runs per feedback."""
    lessons: dict[str, dict] = {}
    for target in targets:
        feedback = target.feedback
        if not feedback.checks:
            continue
        lesson = lessons.setdefault(
            feedback_kind(feedback.text),
            {
                "text": " ".join(feedback.text.split()),
                "checks": feedback.checks,
                "targets": [],
                "passing": [],
                "places": {},  # target id -> _place
                "given": feedback.pk,
            },
        )
        lesson["targets"].append(target)
        lesson["places"][target.pk] = _place(target)
        context = target.student_context or []
        if judged and passes_every_check(feedback.checks, target.target, context=context):
            lesson["passing"].append(target)
        lesson["given"] = min(lesson["given"], feedback.pk)
    return lessons


def _lesson_pairs(lessons: dict[str, dict]) -> Iterator[tuple[dict, dict, list, list]]:
    """Each pair of lessons with the targets of each that fail the other's checks."""
    places = {key: set(lesson["places"].values()) for key, lesson in lessons.items()}
    keys = list(lessons)
    for index, first in enumerate(keys):
        for second in keys[index + 1 :]:
            one_way = _failing_the_other(lessons[first], lessons[second], places[second])
            other_way = _failing_the_other(lessons[second], lessons[first], places[first])
            yield lessons[first], lessons[second], one_way, other_way


def _failing_the_other(lesson: dict, other: dict, other_places: set[str]) -> list[dict]:
    items = []
    for target in lesson["passing"]:  # a target failing its own checks is no evidence
        if lesson["places"][target.pk] not in other_places:
            continue  # the other lesson's checks were never given for a turn in this place
        failed = [
            f"{r.kind} {r.value}"
            for r in check_reply(
                other["checks"], target.target, context=target.student_context or []
            )
            if not r.passed
        ]
        if failed:
            items.append(
                {
                    "target_id": target.pk,
                    "trace_id": target.feedback.trace_id,
                    "trace": target.feedback.trace.external_id,
                    "of": lesson["text"],
                    "fails": "; ".join(failed),
                }
            )
    return items


def _place(target: DistillationTarget) -> str:
    """Where a target's turn is, for judging it by another lesson's checks: a lesson's checks
    are evidence only about the places it was given for.

    After a tool result the place is what the result was (a success, or how many failed in a
    row), whatever the turn is: what to do next is one question whatever was asked, so "after a
    failure, call again" and "after a failure, say you could not check" contradict, and "after
    two failures, say so" is another place. After the user's message, a reply and a tool call
    are different places: whether to call depends on what was asked, so "use the calculator for
    arithmetic" and "answer in one word" agree.
    """
    return _place_of(target.student_context or [], target.target or {})


def _place_of(context: Sequence[dict], reply: dict) -> str:
    if context and context[-1].get("role") == "tool":
        failures = _failures_in_a_row(context)
        return f"after {failures} failed tool results in a row" if failures else "after a result"
    return "a tool call" if reply.get("tool_calls") else "a reply"


def _failures_in_a_row(context: Sequence[dict]) -> int:
    """The failed tool results at the end of a context, counted back over the calls between
    them to a successful result, the user's message or an answer."""
    failures = 0
    for message in reversed(context):
        if message.get("role") == "tool" and tool_result_failed(message):
            failures += 1
        elif not (message.get("role") == "assistant" and message.get("tool_calls")):
            break
    return failures
