"""Reviewers' decisions on distillation targets."""

from reviewapp.ingest.chat import Message
from reviewapp.models import DistillationTarget, TargetState


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
