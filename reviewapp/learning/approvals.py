"""Reviewers' decisions on distillation targets: one choice per feedback."""

import re
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, F, Min, Q

from messages.text import message_text
from reviewapp.learning.lessons import (
    GivenLesson,
    UnkeptLessons,
    earlier_lessons,
    lessons_given,
    unkept_lessons,
)
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.learning.ranking import ProposalScore, closeness, proposal_rank
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import update_settings
from reviewapp.review.models import Feedback
from reviewapp.traces.chat import Message
from reviewapp.traces.rendering import DiffPiece, word_diff
from training.checks import CheckResult, check_reply
from training.readability import reply_well_formedness

CHOSEN_STATES = (TargetState.APPROVED, TargetState.EDITED)
# The targets page shows this many feedback items per tab, newest first.
FEEDBACK_GROUPS_SHOWN = 50
# A proposal keeping less than this share of the original's words (matched in order) is a
# rewrite: shown beside the original, since a word diff of two different texts is a jumble.
REWRITE_KEPT_MAX = 0.5

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class ProposalView:
    target: DistillationTarget
    diff: list[DiffPiece]  # the target against the original answer, word by word
    checks: list[CheckResult]  # each of the feedback's checks on this proposal
    score: ProposalScore
    original_text: str
    target_text: str
    unkept_lessons: tuple[str, ...]  # the team's earlier lessons it does not follow

    @property
    def unchanged(self) -> bool:
        return all(piece.op == "equal" for piece in self.diff)

    @property
    def is_rewrite(self) -> bool:
        """Too little of the original kept for a word diff to read: shown side by side."""
        kept = sum(len(_WORD.findall(p.text)) for p in self.diff if p.op == "equal")
        total = len(_WORD.findall(self.original_text)) + len(_WORD.findall(self.target_text))
        return (
            bool(self.original_text.strip()) and total > 0 and 2 * kept / total < REWRITE_KEPT_MAX
        )

    @property
    def passes_every_check(self) -> bool:
        return self.score.passes_every_check


@dataclass(frozen=True)
class FeedbackTargets:
    """One feedback and its proposals, best first: the reviewer makes one choice for it."""

    feedback: Feedback
    turn: int
    proposals: list[ProposalView]

    @property
    def chosen(self) -> DistillationTarget | None:
        return next((p.target for p in self.proposals if p.target.state in CHOSEN_STATES), None)

    @property
    def lead(self) -> ProposalView:
        """The proposal shown first: the chosen one, else the best ranked."""
        chosen = self.chosen
        return next(p for p in self.proposals if chosen is None or p.target == chosen)

    @property
    def others(self) -> list[ProposalView]:
        lead = self.lead
        return [p for p in self.proposals if p is not lead]

    @property
    def all_rejected(self) -> bool:
        return all(p.target.state == TargetState.REJECTED for p in self.proposals)

    @property
    def approvable(self) -> ProposalView | None:
        """What approving the proposals that pass every check takes for this feedback: the
        best still proposed that does not look garbled, when nothing is chosen and the
        feedback has checks to pass (with none, "passes" proves nothing)."""
        if self.chosen is not None or not self.feedback.checks:
            return None
        return next(
            (
                p
                for p in self.proposals
                if p.target.state == TargetState.PROPOSED
                and p.passes_every_check
                and not p.score.looks_garbled
            ),
            None,
        )


def reply_text(message: dict | None) -> str:
    """A reply as a reviewer compares it: its text, then one line per tool call."""
    if not message:
        return ""
    calls = [
        f"→ {call['function']['name']} {call['function']['arguments']}"
        for call in message.get("tool_calls") or ()
    ]
    return "\n".join(part for part in [message_text(message), *calls] if part)


def readable_diff(pieces: list[DiffPiece]) -> list[DiffPiece]:
    """A word diff with the short islands between two changes (a space, a comma, "the")
    folded into the change, so an edited sentence reads as one removed and one added run
    instead of alternating fragments."""
    readable: list[DiffPiece] = []
    deleted = inserted = ""
    for index, piece in enumerate(pieces):
        between_changes = index + 1 < len(pieces) and pieces[index + 1].op != "equal"
        if piece.op == "delete":
            deleted += piece.text
        elif piece.op == "insert":
            inserted += piece.text
        elif (deleted or inserted) and between_changes and _is_island(piece.text):
            deleted, inserted = deleted + piece.text, inserted + piece.text
        else:
            readable.extend(_changes(deleted, inserted))
            deleted = inserted = ""
            readable.append(piece)
    readable.extend(_changes(deleted, inserted))
    return readable


def _is_island(text: str) -> bool:
    words = _WORD.findall(text)
    return not words or (len(words) == 1 and len(words[0]) <= 3)


def _changes(deleted: str, inserted: str) -> list[DiffPiece]:
    return [DiffPiece(op, text) for op, text in (("delete", deleted), ("insert", inserted)) if text]


def _proposal_view(
    feedback: Feedback, target: DistillationTarget, order: int, unkept: UnkeptLessons
) -> ProposalView:
    checks = check_reply(feedback.checks, target.target, context=target.student_context)
    unkept_texts = unkept(target.target, target.student_context or [])
    original_text, target_text = reply_text(target.original), reply_text(target.target)
    score = ProposalScore(
        checks_passed=sum(result.passed for result in checks),
        checks_total=len(checks),
        passed_when_proposed=target.passes_checks,
        well_formedness=reply_well_formedness(target.target, feedback_text=feedback.text),
        closeness=closeness(message_text(target.original or {}), message_text(target.target)),
        order=order,
        keeps_earlier_lessons=not unkept_texts,
    )
    return ProposalView(
        target=target,
        diff=readable_diff(word_diff(original_text, target_text)),
        checks=checks,
        score=score,
        original_text=original_text,
        target_text=target_text,
        unkept_lessons=unkept_texts,
    )


def _group(
    feedback: Feedback, targets: list[DistillationTarget], given: Sequence[GivenLesson]
) -> FeedbackTargets:
    unkept = unkept_lessons(earlier_lessons(feedback, given))
    views = [
        _proposal_view(feedback, target, order, unkept) for order, target in enumerate(targets)
    ]
    ranked = sorted(views, key=lambda view: proposal_rank(view.score))
    return FeedbackTargets(feedback=feedback, turn=ranked[0].target.turn, proposals=ranked)


def _feedback_in_state(project: Project, state: str):
    """Feedback by where its choice stands: `proposed` (nothing chosen yet), `approved` or
    `edited` (that is the choice), `rejected` (every proposal turned down)."""
    feedback = Feedback.objects.filter(trace__project=project).annotate(
        proposed=Count("targets", filter=Q(targets__state=TargetState.PROPOSED)),
        chosen=Count("targets", filter=Q(targets__state__in=CHOSEN_STATES)),
        in_state=Count("targets", filter=Q(targets__state=state)),
        total=Count("targets"),
    )
    if state == TargetState.PROPOSED:
        return feedback.filter(proposed__gt=0, chosen=0)
    if state == TargetState.REJECTED:
        return feedback.filter(total__gt=0, in_state=F("total"))
    return feedback.filter(in_state__gt=0)


def state_counts(*, project: Project) -> dict[str, int]:
    """How many feedback items each tab of the targets page lists, by state."""
    return {state: _feedback_in_state(project, state).count() for state in TargetState.values}


def feedback_targets(
    *,
    project: Project,
    state: str,
    limit: int = FEEDBACK_GROUPS_SHOWN,
    before_feedback_id: int | None = None,
    feedback_ids: list[int] | None = None,
) -> list[FeedbackTargets]:
    """The feedback whose choice is in `state`, newest first, each with its ranked proposals;
    `before_feedback_id` pages on (the API's cursor), `feedback_ids` keeps only those."""
    if state not in TargetState.values:
        raise ValueError(f"unknown target state {state!r}")
    feedback = _feedback_in_state(project, state)
    if before_feedback_id is not None:
        feedback = feedback.filter(pk__lt=before_feedback_id)
    if feedback_ids is not None:
        feedback = feedback.filter(pk__in=feedback_ids)
    feedback = list(
        feedback.select_related("trace", "reviewer", "api_key")
        .defer("trace__body", "trace__metadata")
        .order_by("-id")[:limit]
    )
    targets: dict[int, list[DistillationTarget]] = {}
    for target in DistillationTarget.objects.filter(feedback__in=feedback).order_by("id"):
        targets.setdefault(target.feedback_id, []).append(target)
    given = lessons_given(project.pk)  # once for the page, not once per feedback
    return [_group(item, targets[item.pk], given) for item in feedback if item.pk in targets]


def feedback_targets_for(*, feedback: Feedback) -> FeedbackTargets | None:
    """One feedback's proposals, ranked; None when it has none (deleted meanwhile)."""
    targets = list(feedback.targets.order_by("id"))
    return _group(feedback, targets, lessons_given(feedback.trace.project_id)) if targets else None


@transaction.atomic
def choose_target(
    *,
    feedback: Feedback,
    decision: str,
    reviewer,
    target_id: int | None = None,
    edited_text: str | None = None,
) -> int:
    """The reviewer's one choice for a feedback: "approve" one proposal or "edit" it (its
    siblings are rejected: near-identical targets would weigh one feedback several times),
    or "reject" them all. Returns how many proposals the choice rejected that were not
    rejected before."""
    Feedback.objects.select_for_update().filter(pk=feedback.pk).first()
    targets = DistillationTarget.objects.filter(feedback=feedback)
    if decision == "reject":
        return targets.exclude(state=TargetState.REJECTED).update(
            state=TargetState.REJECTED, reviewed_by=reviewer
        )
    if decision not in ("approve", "edit"):
        raise ValueError(f"unknown decision {decision!r}")
    chosen = targets.filter(pk=target_id).first() if target_id is not None else None
    if chosen is None:
        raise ValueError("choose one of this feedback's proposals")
    if decision == "edit":
        text = (edited_text or "").strip()
        if not text:
            raise ValueError("an edited target needs text")
        edited = {**chosen.target, "content": text}
        Message.model_validate(edited)
        chosen.target, chosen.state = edited, TargetState.EDITED
    else:
        chosen.state = TargetState.APPROVED
    chosen.reviewed_by = reviewer
    chosen.save(update_fields=["state", "target", "reviewed_by"])
    return (
        targets.exclude(pk=chosen.pk)
        .exclude(state=TargetState.REJECTED)
        .update(state=TargetState.REJECTED, reviewed_by=reviewer)
    )


class ChoiceLocked(ValueError):
    """The choice was trained on: it is an adapter's lineage and stays as it is."""


@transaction.atomic
def reopen_choice(*, feedback: Feedback) -> int:
    """Undo a feedback's choice (an approval, an edit or reject all): every proposal is
    proposed again, for a reviewer to choose anew; an edit keeps its edited text. Refused once
    a training run has used one of them. Returns how many proposals changed."""
    Feedback.objects.select_for_update().filter(pk=feedback.pk).first()
    targets = DistillationTarget.objects.filter(feedback=feedback)
    if targets.filter(runs__isnull=False).exists():
        raise ChoiceLocked(
            "a training run has used this choice: it is part of an adapter's lineage"
        )
    return targets.exclude(state=TargetState.PROPOSED).update(
        state=TargetState.PROPOSED, reviewed_by=None
    )


@dataclass(frozen=True)
class BulkApproval:
    approved: int  # proposals approved, one per feedback
    rejected: int  # their siblings, rejected by those approvals
    skipped: int  # feedback asked for that had no such proposal (decided meanwhile, say)


@transaction.atomic
def approve_passing_proposals(
    *, project: Project, feedback_ids: list[int], reviewer
) -> BulkApproval:
    """For each listed feedback still waiting for a choice, approve its best proposal that
    passes every one of the feedback's checks, as one reviewer's choice would (its siblings
    are rejected). Feedback with no checks, or no such proposal, is left as it is."""
    locked = list(
        Feedback.objects.select_for_update()
        .filter(pk__in=feedback_ids, trace__project=project)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    groups = feedback_targets(
        project=project, state=TargetState.PROPOSED, limit=len(locked), feedback_ids=locked
    )
    approved = rejected = 0
    for group in groups:
        proposal = group.approvable
        if proposal is None:
            continue
        rejected += choose_target(
            feedback=group.feedback,
            decision="approve",
            reviewer=reviewer,
            target_id=proposal.target.pk,
        )
        approved += 1
    return BulkApproval(
        approved=approved, rejected=rejected, skipped=len(set(feedback_ids)) - approved
    )


@transaction.atomic
def reject_target(*, target: DistillationTarget, reviewer) -> None:
    """Turn down one proposal; its feedback's other proposals keep their state."""
    Feedback.objects.select_for_update().filter(pk=target.feedback_id).first()
    DistillationTarget.objects.filter(pk=target.pk).update(
        state=TargetState.REJECTED, reviewed_by=reviewer
    )


AUTO_APPROVE_POLICIES = {
    "manual": "a reviewer approves every proposed target",
    "checks_pass": "targets that pass their feedback's checks are approved as they are proposed",
}


@transaction.atomic
def set_auto_approve(*, project: Project, policy: str, apply_to_proposed: bool = False) -> int:
    """Store the project's auto-approve policy; optionally approve what it would have approved.

    Only targets whose feedback has checks qualify: with no checks, "passes" proves nothing.
    One per feedback, as the target task does: the best passing proposal (proposals are stored
    best first), where nothing is chosen yet. Returns how many were approved now.
    """
    if policy not in AUTO_APPROVE_POLICIES:
        raise ValueError(f"unknown auto-approve policy {policy!r}")
    update_settings(project=project, changes={"auto_approve": policy})
    if policy != "checks_pass" or not apply_to_proposed:
        return 0
    best = (
        DistillationTarget.objects.filter(
            feedback__trace__project=project, state=TargetState.PROPOSED, passes_checks=True
        )
        .exclude(feedback__checks=[])
        .exclude(feedback__targets__state__in=CHOSEN_STATES)
        .values("feedback")
        .annotate(best=Min("id"))
        .values_list("best", flat=True)
    )
    return DistillationTarget.objects.filter(pk__in=list(best)).update(state=TargetState.APPROVED)
