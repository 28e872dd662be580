"""Training-data accounting: what goes into a training set, and why each thing left out is out.

Nothing leaves silently. Every distillation target of the project, and every feedback that has
no target yet, is a candidate; each candidate is either included or counted under exactly one
reason, so included + excluded = total. Timed-out and tool-failed traces stay by default (their
feedback teaches like any other, and the monitors count them as failures); the project's data
policy, `Project.settings["data_policy"]`, can exclude them, and then they are counted too.
"""

from collections import Counter
from dataclasses import dataclass, field

import orjson
from django.db.models import QuerySet

from reviewapp.learning.lessons import superseded_targets
from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import DataPolicy, settings_for, update_settings
from reviewapp.review.models import Feedback, FeedbackStatus
from reviewapp.traces.models import Termination, Trace

# Reasons in the order they are tested: a candidate is counted under the first that applies.
REASONS = {
    "feedback_dismissed": "feedback dismissed",
    "feedback_without_targets": "feedback without targets yet",
    "target_not_reviewed": "target not reviewed yet",
    "target_rejected": "target rejected by a reviewer",
    "fails_checks": "target fails its feedback's checks",
    "policy_timeout": "trace timed out (data policy: exclude)",
    "policy_tool_error": "trace ended in a tool error (data policy: exclude)",
    "duplicate": "duplicate of another target (same context and reply)",
    "superseded": "target fails the checks of a lesson given after its own",
}


def data_policy_for(project: Project) -> DataPolicy:
    """The project's data policy; raises SettingsError (a ValueError) when stored settings are
    not valid."""
    return settings_for(project).data_policy


def set_data_policy(*, project: Project, policy: DataPolicy) -> Project:
    """Store the policy; the rest of the project's settings are left as they are."""
    update_settings(project=project, changes={"data_policy": policy.model_dump()})
    return project


@dataclass
class TrainingSet:
    policy: DataPolicy
    targets: list[DistillationTarget]
    excluded: dict[str, int]  # reason -> count, every reason present (0 when none)
    # Included targets from traces that ended badly: kept by the policy, counted as failures.
    kept_failures: dict[str, int] = field(default_factory=dict)
    # Left out as superseded (counted in `excluded`), still worth evaluating: the serving
    # adapter learned them, and a run is judged on keeping them.
    superseded: list[DistillationTarget] = field(default_factory=list)

    @property
    def included(self) -> int:
        return len(self.targets)

    @property
    def usable(self) -> list[DistillationTarget]:
        """Every target fit to learn from, superseded ones too, in the order they were made."""
        return sorted([*self.targets, *self.superseded], key=lambda target: target.pk)

    @property
    def total(self) -> int:
        return self.included + sum(self.excluded.values())

    def exclusion_rows(self) -> list[tuple[str, str, int]]:
        """(reason, label, count) in the order the reasons are tested."""
        return [(reason, REASONS[reason], self.excluded[reason]) for reason in REASONS]

    def as_json(self) -> dict:
        return {
            "total": self.total,
            "included": self.included,
            "excluded": dict(self.excluded),
            "kept_failures": dict(self.kept_failures),
            "policy": self.policy.model_dump(),
        }


def _exclusion_reason(target: DistillationTarget, policy: DataPolicy) -> str | None:
    if target.feedback.status == FeedbackStatus.DISMISSED:  # kept for lineage, not for learning
        return "feedback_dismissed"
    if target.state == TargetState.PROPOSED:
        return "target_not_reviewed"
    if target.state == TargetState.REJECTED:
        return "target_rejected"
    # An edited target was rewritten by a reviewer: the checks judged the teacher's text.
    if (
        target.state == TargetState.APPROVED
        and not target.passes_checks
        and policy.failing_checks == "exclude"
    ):
        return "fails_checks"
    termination = target.feedback.trace.termination
    if termination in policy.excluded_terminations():
        return f"policy_{termination}"
    return None


def build_training_set(
    *, project: Project, traces: QuerySet[Trace] | None = None, policy: DataPolicy | None = None
) -> TrainingSet:
    """The targets a run would learn from, and a count per reason of everything left out.

    `traces` narrows the candidates to feedback on those traces (the export's filters);
    raises ValueError when the project's stored data policy is not valid.
    """
    policy = policy or data_policy_for(project)
    feedback = Feedback.objects.filter(trace__project=project)
    if traces is not None:
        feedback = feedback.filter(trace__in=traces)
    excluded: Counter[str] = Counter({reason: 0 for reason in REASONS})
    for row in feedback.filter(targets__isnull=True).values("status"):
        dismissed = row["status"] == FeedbackStatus.DISMISSED
        excluded["feedback_dismissed" if dismissed else "feedback_without_targets"] += 1

    candidates = (
        DistillationTarget.objects.filter(feedback__in=feedback)
        .select_related("feedback__trace")
        .defer("feedback__trace__body", "feedback__trace__metadata")
        .order_by("id")
    )
    usable: list[DistillationTarget] = []
    seen: set[bytes] = set()
    for target in candidates.iterator(chunk_size=500):
        reason = _exclusion_reason(target, policy)
        if reason is None:
            key = orjson.dumps([target.student_context, target.target], option=orjson.OPT_SORT_KEYS)
            if key in seen:
                reason = "duplicate"
            seen.add(key)
        if reason is not None:
            excluded[reason] += 1
            continue
        usable.append(target)
    superseded_ids = superseded_targets(usable)
    excluded["superseded"] += len(superseded_ids)
    included = [target for target in usable if target.pk not in superseded_ids]
    kept_failures: Counter[str] = Counter()
    for target in included:
        termination = target.feedback.trace.termination
        if termination in (Termination.TIMEOUT, Termination.TOOL_ERROR):
            kept_failures[termination] += 1
    return TrainingSet(
        policy=policy,
        targets=included,
        excluded=dict(excluded),
        kept_failures=dict(kept_failures),
        superseded=[target for target in usable if target.pk in superseded_ids],
    )
