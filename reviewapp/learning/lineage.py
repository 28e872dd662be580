"""Where an adapter came from and what it changed: read-only queries over runs and their reports.

The report is the run's metrics as the worker stored them (training/tasks.py); older runs lack
some sections, so every reader here tolerates a missing key.
"""

from dataclasses import dataclass, field

from reviewapp.learning.models import Adapter, DistillationTarget
from reviewapp.review.models import Feedback

# The evaluation's statuses in the order training/evaluation.py reports them (not imported:
# that module loads torch, and the dashboard must not).
STATUSES = ("fixed", "still failing", "regressed", "still passing")


def held_out_feedback_ids(report: dict) -> set[int]:
    """Feedback the run evaluated on but did not train on."""
    items = (report.get("held_out") or {}).get("items") or []
    return {item["feedback_id"] for item in items if isinstance(item.get("feedback_id"), int)}


def adapter_report(adapter: Adapter) -> dict:
    """The run's metrics (they carry the gate's decision), else what the adapter row kept."""
    if adapter.run is not None and adapter.run.metrics:
        return adapter.run.metrics
    return adapter.eval_results or {}


def adapters_by_feedback(feedback_ids: list[int]) -> dict[int, list[Adapter]]:
    """Which adapter versions learned from each feedback (held-out feedback is not learned), in
    one query: one row per (adapter, target of that feedback)."""
    rows = (
        Adapter.objects.filter(run__targets__feedback_id__in=feedback_ids)
        .values_list(
            "project_id", "version", "name", "run__targets__feedback_id", "run__metrics__held_out"
        )
        .order_by("version")
        .distinct()
    )
    learned: dict[int, list[Adapter]] = {}
    for project_id, version, name, feedback_id, held_out in rows:
        if feedback_id in held_out_feedback_ids({"held_out": held_out}):
            continue
        versions = learned.setdefault(feedback_id, [])
        if all(adapter.version != version for adapter in versions):
            versions.append(Adapter(project_id=project_id, version=version, name=name))
    return learned


@dataclass
class EvalRow:
    """One before/after comparison, with the rows it refers to when they still exist."""

    status: str
    before: dict
    after: dict
    feedback: Feedback | None = None
    target: DistillationTarget | None = None
    divergence_before: float | None = None
    divergence_after: float | None = None
    source: str = ""
    prompt: str = ""
    trace_id: int | None = None
    drift: float | None = None


@dataclass
class Lineage:
    targets: list[DistillationTarget]  # what the adapter was trained on
    held_out_targets: list[DistillationTarget]  # evaluated on, not trained on
    feedback: list[Feedback]  # behind `targets`
    reviewers: list[str]  # who wrote that feedback or approved those targets
    report: dict
    feedback_rows: list[EvalRow] = field(default_factory=list)
    held_out_rows: list[EvalRow] = field(default_factory=list)
    regression_rows: list[EvalRow] = field(default_factory=list)


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _row(item: dict, targets: dict, feedback: dict) -> EvalRow:
    target = targets.get(item.get("target_id"))
    feedback_id = item.get("feedback_id") or (target.feedback_id if target else None)
    trace_id = item.get("trace_id")
    return EvalRow(
        status=str(item.get("status", "")),
        before=item.get("before") or {},
        after=item.get("after") or {},
        feedback=feedback.get(feedback_id),
        target=target,
        divergence_before=_number(item.get("divergence_before")),
        divergence_after=_number(item.get("divergence_after")),
        source=str(item.get("source", "")),
        prompt=str(item.get("prompt", "")),
        trace_id=trace_id if isinstance(trace_id, int) and not isinstance(trace_id, bool) else None,
        drift=_number(item.get("drift")),
    )


def adapter_lineage(adapter: Adapter) -> Lineage:
    """Targets, feedback, reviewers and the evaluation report of one adapter."""
    report = adapter_report(adapter)
    held_out_ids = held_out_feedback_ids(report)
    run_targets = []
    if adapter.run is not None:
        run_targets = list(
            adapter.run.targets.select_related(
                "feedback__trace", "feedback__reviewer", "feedback__api_key", "reviewed_by"
            )
            .defer("feedback__trace__body", "feedback__trace__metadata")
            .order_by("id")
        )
    learned = [target for target in run_targets if target.feedback_id not in held_out_ids]
    feedback_by_id = {target.feedback_id: target.feedback for target in run_targets}
    # Held-out feedback normally has targets in the run; one that lost them is still named.
    missing = held_out_ids - set(feedback_by_id)
    if missing:
        feedback_by_id.update(
            (feedback.pk, feedback)
            for feedback in Feedback.objects.filter(
                pk__in=missing, trace__project=adapter.project
            ).select_related("reviewer", "api_key")
        )
    senders = {target.feedback.sender for target in learned} - {"unknown sender"}
    reviewers = senders | {
        target.reviewed_by.get_username() for target in learned if target.reviewed_by
    }
    targets_by_id = {target.pk: target for target in run_targets}
    rows = [
        _row(item, targets_by_id, feedback_by_id)
        for item in report.get("items") or []
        if isinstance(item, dict)
    ]
    return Lineage(
        targets=learned,
        held_out_targets=[target for target in run_targets if target.feedback_id in held_out_ids],
        feedback=sorted(
            {target.feedback_id: target.feedback for target in learned}.values(),
            key=lambda feedback: feedback.pk,
        ),
        reviewers=sorted(reviewers - {""}),
        report=report,
        feedback_rows=rows,
        held_out_rows=[
            _row(item, targets_by_id, feedback_by_id)
            for item in (report.get("held_out") or {}).get("items") or []
            if isinstance(item, dict)
        ],
        regression_rows=[
            _row(item, targets_by_id, feedback_by_id)
            for item in (report.get("regression") or {}).get("items") or []
            if isinstance(item, dict)
        ],
    )
