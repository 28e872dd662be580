"""Reviewers' decisions on distillation targets: one choice per feedback."""

from dataclasses import dataclass
from difflib import SequenceMatcher

from django.db import transaction
from django.db.models import Count, F, Min, Q

from messages.text import message_text
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import update_settings
from reviewapp.review.models import Feedback
from reviewapp.traces.chat import Message
from reviewapp.traces.rendering import DiffPiece, word_diff

CHOSEN_STATES = (TargetState.APPROVED, TargetState.EDITED)
# The targets page shows this many feedback items per tab, newest first.
FEEDBACK_GROUPS_SHOWN = 50


@dataclass(frozen=True)
class ProposalView:
    target: DistillationTarget
    diff: list[DiffPiece]  # the target against the original answer, word by word

    @property
    def unchanged(self) -> bool:
        return all(piece.op == "equal" for piece in self.diff)


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


def reply_text(message: dict | None) -> str:
    """A reply as a reviewer compares it: its text, then one line per tool call."""
    if not message:
        return ""
    calls = [
        f"→ {call['function']['name']} {call['function']['arguments']}"
        for call in message.get("tool_calls") or ()
    ]
    return "\n".join(part for part in [message_text(message), *calls] if part)


def _rank_key(target: DistillationTarget) -> tuple:
    # As training.targets.propose_targets ranks the teacher's revisions: passing ones first, then
    # the closest to the original answer; ties in the order they were proposed.
    original = message_text(target.original or {})
    closeness = SequenceMatcher(None, original, message_text(target.target)).ratio()
    return (not target.passes_checks, -closeness, target.pk)


def _group(feedback: Feedback, targets: list[DistillationTarget]) -> FeedbackTargets:
    ranked = sorted(targets, key=_rank_key)
    return FeedbackTargets(
        feedback=feedback,
        turn=ranked[0].turn,
        proposals=[
            ProposalView(
                target=target,
                diff=word_diff(reply_text(target.original), reply_text(target.target)),
            )
            for target in ranked
        ],
    )


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


def feedback_targets(
    *,
    project: Project,
    state: str,
    limit: int = FEEDBACK_GROUPS_SHOWN,
    before_feedback_id: int | None = None,
) -> list[FeedbackTargets]:
    """The feedback whose choice is in `state`, newest first, each with its ranked proposals;
    `before_feedback_id` pages on (the API's cursor)."""
    if state not in TargetState.values:
        raise ValueError(f"unknown target state {state!r}")
    feedback = _feedback_in_state(project, state)
    if before_feedback_id is not None:
        feedback = feedback.filter(pk__lt=before_feedback_id)
    feedback = list(
        feedback.select_related("trace", "reviewer", "api_key")
        .defer("trace__body", "trace__metadata")
        .order_by("-id")[:limit]
    )
    targets: dict[int, list[DistillationTarget]] = {}
    for target in DistillationTarget.objects.filter(feedback__in=feedback).order_by("id"):
        targets.setdefault(target.feedback_id, []).append(target)
    return [_group(item, targets[item.pk]) for item in feedback if item.pk in targets]


def feedback_targets_for(*, feedback: Feedback) -> FeedbackTargets | None:
    """One feedback's proposals, ranked; None when it has none (deleted meanwhile)."""
    targets = list(feedback.targets.order_by("id"))
    return _group(feedback, targets) if targets else None


@transaction.atomic
def choose_target(
    *,
    feedback: Feedback,
    decision: str,
    reviewer,
    target_id: int | None = None,
    edited_text: str | None = None,
) -> None:
    """The reviewer's one choice for a feedback: "approve" one proposal or "edit" it (its
    siblings are rejected: near-identical targets would weigh one feedback several times),
    or "reject" them all."""
    Feedback.objects.select_for_update().filter(pk=feedback.pk).first()
    targets = DistillationTarget.objects.filter(feedback=feedback)
    if decision == "reject":
        targets.update(state=TargetState.REJECTED, reviewed_by=reviewer)
        return
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
    targets.exclude(pk=chosen.pk).update(state=TargetState.REJECTED, reviewed_by=reviewer)


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
