"""Reviewers' decisions on distillation targets."""

from django.db import transaction

from reviewapp.ingest.chat import Message
from reviewapp.models import DistillationTarget, Project, TargetState
from reviewapp.project_settings import update_settings


def review_target(
    *, target: DistillationTarget, decision: str, reviewer, edited_text: str | None = None
) -> DistillationTarget:
    """Approve, reject, or approve with an edited reply ("edit")."""
    if decision == "approve":
        target.state = TargetState.APPROVED
    elif decision == "reject":
        target.state = TargetState.REJECTED
    elif decision == "edit":
        text = (edited_text or "").strip()
        if not text:
            raise ValueError("an edited target needs text")
        edited = {**target.target, "content": text}
        Message.model_validate(edited)
        target.target = edited
        target.state = TargetState.EDITED
    else:
        raise ValueError(f"unknown decision {decision!r}")
    target.reviewed_by = reviewer
    target.save(update_fields=["state", "target", "reviewed_by"])
    return target


AUTO_APPROVE_POLICIES = {
    "manual": "a reviewer approves every proposed target",
    "checks_pass": "targets that pass their feedback's checks are approved as they are proposed",
}


@transaction.atomic
def set_auto_approve(*, project: Project, policy: str, apply_to_proposed: bool = False) -> int:
    """Store the project's auto-approve policy; optionally approve what it would have approved.

    Only targets whose feedback has checks qualify: with no checks, "passes" proves nothing.
    Returns how many proposed targets were approved now.
    """
    if policy not in AUTO_APPROVE_POLICIES:
        raise ValueError(f"unknown auto-approve policy {policy!r}")
    update_settings(project=project, changes={"auto_approve": policy})
    if policy != "checks_pass" or not apply_to_proposed:
        return 0
    return (
        DistillationTarget.objects.filter(
            feedback__trace__project=project, state=TargetState.PROPOSED, passes_checks=True
        )
        .exclude(feedback__checks=[])
        .update(state=TargetState.APPROVED)
    )
