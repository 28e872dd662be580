"""Distillation targets over the API: what the targets page shows, and the reviewer's one
choice per feedback (approve a proposal, edit it, or reject proposals). A `review` key decides
as a reviewer with no user, so `reviewed_by` stays empty."""

from datetime import datetime
from typing import Any

from django.http import Http404, HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError
from pydantic import field_validator

from reviewapp.api.pagination import decode_cursor, page_of
from reviewapp.api.schemas import ERRORS
from reviewapp.learning.approvals import (
    ChoiceLocked,
    FeedbackTargets,
    choose_target,
    feedback_targets,
    feedback_targets_for,
    reject_target,
    reopen_choice,
)
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.projects.access import first_or_404
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope, Project
from reviewapp.review.api import READ

router = Router(tags=["review"])


class ProposalOut(Schema):
    id: int
    source: str  # "hint" / "rewrite": the teacher's revision; "correction": a person's
    state: TargetState
    passes_checks: bool
    original: dict[str, Any] | None  # the assistant turn as the model wrote it
    target: dict[str, Any]  # the assistant message the adapter would learn
    # The team's earlier lessons (given before this feedback, for the same place) this
    # proposal does not follow, as the targets page marks them; ranked after those it keeps.
    breaks_earlier_lessons: list[str]
    created_at: datetime


class FeedbackTargetsOut(Schema):
    feedback_id: int
    trace: str  # the trace's external_id
    turn: int  # the index in messages of the assistant turn the targets replace
    feedback: str
    chosen: int | None  # the approved or edited proposal; one choice per feedback
    # Best first, as the targets page ranks them (learning/ranking.proposal_rank): readable
    # before garbled, then passing the checks, then keeping the earlier lessons, then closest
    # to the original.
    proposals: list[ProposalOut]


class TargetListOut(Schema):
    feedback: list[FeedbackTargetsOut]
    next: str | None


class TargetFilters(Schema):
    state: TargetState = Field(
        TargetState.PROPOSED,
        description="proposed: nothing chosen yet; approved / edited: the choice made; "
        "rejected: every proposal turned down",
    )
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = None


class EditIn(Schema):
    content: str = Field(..., min_length=1, max_length=32_000, description="the reply's text")

    @field_validator("content")
    @classmethod
    def has_text(cls, content: str) -> str:
        if not content.strip():
            raise ValueError("must not be blank")
        if "\x00" in content:
            raise ValueError("contains a NUL character (\\u0000), which cannot be stored")
        return content


def _group_json(group: FeedbackTargets) -> dict:
    chosen = group.chosen
    return {
        "feedback_id": group.feedback.pk,
        "trace": group.feedback.trace.external_id,
        "turn": group.turn,
        "feedback": group.feedback.text,
        "chosen": chosen.pk if chosen else None,
        "proposals": [
            {
                "id": proposal.target.pk,
                "source": proposal.target.source,
                "state": proposal.target.state,
                "passes_checks": proposal.target.passes_checks,
                "original": proposal.target.original,
                "target": proposal.target.target,
                "breaks_earlier_lessons": list(proposal.unkept_lessons),
                "created_at": proposal.target.created_at,
            }
            for proposal in group.proposals
        ],
    }


def _get_target_for_project(project: Project, target_id: int) -> DistillationTarget:
    targets = (
        DistillationTarget.objects.select_related("feedback__trace")
        .defer("feedback__trace__body", "feedback__trace__metadata")
        .filter(pk=target_id, feedback__trace__project=project)
    )
    return first_or_404(targets, f"no target {target_id} in this project")


def _decided(target: DistillationTarget) -> dict:
    group = feedback_targets_for(feedback=target.feedback)
    if group is None:  # its feedback was deleted meanwhile
        raise Http404(f"no target {target.pk} in this project")
    return _group_json(group)


@router.get(
    "/targets",
    response={200: TargetListOut, **ERRORS},
    summary="Distillation targets grouped by their feedback, newest feedback first",
    **requires(*READ),
)
def list_targets(request: HttpRequest, filters: Query[TargetFilters]):
    groups = feedback_targets(
        project=request.auth,
        state=filters.state,
        limit=filters.limit + 1,
        before_feedback_id=decode_cursor(filters.cursor) if filters.cursor else None,
    )
    page, next_cursor = page_of(groups, filters.limit, key=lambda group: group.feedback.pk)
    return {"feedback": [_group_json(group) for group in page], "next": next_cursor}


def _choose(request: HttpRequest, target_id: int, decision: str, text: str | None = None) -> dict:
    target = _get_target_for_project(request.auth, target_id)
    try:
        choose_target(
            feedback=target.feedback,
            decision=decision,
            reviewer=None,
            target_id=target.pk,
            edited_text=text,
        )
    except ValueError as error:  # an edit the chat format refuses, say
        raise HttpError(422, str(error)) from None
    return _decided(target)


@router.post(
    "/targets/{target_id}/approve",
    response={200: FeedbackTargetsOut, **ERRORS},
    summary="Approve a proposal as it is; its feedback's other proposals are rejected",
    **requires(KeyScope.REVIEW),
)
def approve_target(request: HttpRequest, target_id: int):
    return _choose(request, target_id, "approve")


@router.post(
    "/targets/{target_id}/edit",
    response={200: FeedbackTargetsOut, **ERRORS},
    summary="Approve a proposal with its text replaced; the other proposals are rejected",
    **requires(KeyScope.REVIEW),
)
def edit_target(request: HttpRequest, target_id: int, payload: EditIn):
    return _choose(request, target_id, "edit", payload.content)


@router.post(
    "/targets/{target_id}/reopen",
    response={200: FeedbackTargetsOut, **ERRORS},
    summary="Undo its feedback's choice: every proposal is proposed again (409 once a run "
    "trained on it)",
    **requires(KeyScope.REVIEW),
)
def reopen_target(request: HttpRequest, target_id: int):
    target = _get_target_for_project(request.auth, target_id)
    try:
        reopen_choice(feedback=target.feedback)
    except ChoiceLocked as error:
        raise HttpError(409, str(error)) from None
    return _decided(target)


@router.post(
    "/targets/{target_id}/reject",
    response={200: FeedbackTargetsOut, **ERRORS},
    summary="Reject one proposal; the feedback's others keep their state",
    **requires(KeyScope.REVIEW),
)
def reject_one_target(request: HttpRequest, target_id: int):
    target = _get_target_for_project(request.auth, target_id)
    reject_target(target=target, reviewer=None)
    return _decided(target)
