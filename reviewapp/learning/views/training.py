"""Targets to approve, the Retrain button, and a run's live page."""

from collections import Counter

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from reviewapp.charts import line_chart
from reviewapp.learning.approvals import (
    AUTO_APPROVE_POLICIES,
    ChoiceLocked,
    approve_passing_proposals,
    choose_target,
    feedback_targets,
    feedback_targets_for,
    reopen_choice,
    set_auto_approve,
    state_counts,
)
from reviewapp.learning.dataset import build_training_set
from reviewapp.learning.forms import AutoApproveForm, RetrainForm
from reviewapp.learning.lessons import lesson_ledger
from reviewapp.learning.models import Adapter, DistillationTarget, TargetState, TrainingRun
from reviewapp.learning.plan import RunPlan, frozen_plan
from reviewapp.learning.runs import RetrainError, is_presumed_dead, request_cancel, start_retrain
from reviewapp.learning.selectors import approved_targets, tags_by_trace
from reviewapp.projects.access import (
    get_admin_membership_for_user,
    get_membership_for_user,
    get_reviewer_membership_for_user,
)
from reviewapp.projects.models import Project
from reviewapp.projects.outbound import allowed_upstreams
from reviewapp.projects.project_settings import SettingsError, settings_for
from reviewapp.review.feedback_health import unusable_feedback
from reviewapp.review.models import Feedback


def _base_context(request: HttpRequest, membership) -> dict:
    return {
        "membership": membership,
        "project": membership.project,
    }


def _get_feedback_for_membership(membership, feedback_id: int) -> Feedback:
    feedback = (
        Feedback.objects.select_related("trace")
        .defer("trace__body", "trace__metadata")
        .filter(pk=feedback_id, trace__project=membership.project)
        .first()
    )
    if feedback is None:
        raise Http404("no such feedback")
    return feedback


def _get_run_for_membership(membership, run_id: int) -> TrainingRun:
    run = TrainingRun.objects.filter(pk=run_id, project=membership.project).first()
    if run is None:
        raise Http404("no such run")
    return run


@login_required
def target_list(request: HttpRequest, slug: str) -> HttpResponse:
    """Proposals grouped per feedback, each a diff against the original answer."""
    membership = get_membership_for_user(request.user, slug)
    state = request.GET.get("state") or TargetState.PROPOSED
    if state not in TargetState.values:
        return HttpResponseBadRequest(
            f"state: {state!r} is not one of {', '.join(TargetState.values)}"
        )
    groups = feedback_targets(project=membership.project, state=state)
    context = {
        **_base_context(request, membership),
        "groups": groups,
        "state": state,
        "counts": state_counts(project=membership.project),
        "approvable": [group for group in groups if group.approvable],
        **_policy_context(membership.project),
    }
    return render(request, "learning/targets.html", context)


@require_POST
@login_required
def target_approve_passing(request: HttpRequest, slug: str) -> HttpResponse:
    """Approve, for each feedback listed, its best proposal that passes every check."""
    membership = get_reviewer_membership_for_user(request.user, slug)
    raw_ids = request.POST.getlist("feedback")
    if not raw_ids or not all(raw.isdigit() for raw in raw_ids):
        return HttpResponseBadRequest("feedback: list the feedback ids to approve proposals for")
    outcome = approve_passing_proposals(
        project=membership.project,
        feedback_ids=[int(raw) for raw in raw_ids],
        reviewer=request.user,
    )
    summary = (
        f"Approved {outcome.approved} proposal{'s' * (outcome.approved != 1)} passing every "
        f"check; that rejected {outcome.rejected} other proposal{'s' * (outcome.rejected != 1)} "
        "for the same feedback."
    )
    if outcome.skipped:
        summary += (
            f" {outcome.skipped} listed had no proposal to approve (decided meanwhile, no "
            "checks, or none passing every check that reads well)."
        )
    messages.success(request, summary)
    return redirect("target_list", slug=slug)


def _policy_context(project, form: AutoApproveForm | None = None, approved_now: int = 0) -> dict:
    try:
        policy = settings_for(project).auto_approve
    except SettingsError:  # the teacher task cannot read them either: nothing is auto-approved
        policy = "manual"
    return {
        "policy_form": form or AutoApproveForm(initial={"policy": policy}),
        "policy_description": AUTO_APPROVE_POLICIES.get(policy, policy),
        "approved_now": approved_now,
    }


@require_POST
@login_required
def target_policy(request: HttpRequest, slug: str) -> HttpResponse:
    """Admins choose whether targets that pass their checks skip the reviewer."""
    membership = get_admin_membership_for_user(request.user, slug)
    project = membership.project
    form = AutoApproveForm(request.POST)
    approved_now, status = 0, 422
    if form.is_valid():
        approved_now = set_auto_approve(
            project=project,
            policy=form.cleaned_data["policy"],
            apply_to_proposed=form.cleaned_data["apply_to_proposed"],
        )
        form, status = None, 200
    if not request.htmx and status == 200:
        return redirect("target_list", slug=slug)
    context = {**_base_context(request, membership), **_policy_context(project, form, approved_now)}
    return render(request, "learning/targets.html#target-policy", context, status=status)


@require_POST
@login_required
def target_choice(request: HttpRequest, slug: str, feedback_id: int) -> HttpResponse:
    """One choice per feedback: use one proposal (as it is or edited), or reject them all; or
    reopen the choice made (undo)."""
    membership = get_reviewer_membership_for_user(request.user, slug)
    feedback = _get_feedback_for_membership(membership, feedback_id)
    target_id = request.POST.get("target", "")
    decision = request.POST.get("decision", "")
    error, status, rejected_now = "", 200, 0
    try:
        if decision == "reopen":
            reopen_choice(feedback=feedback)
        else:
            rejected_now = choose_target(
                feedback=feedback,
                decision=decision,
                reviewer=request.user,
                target_id=int(target_id) if target_id.isdigit() else None,
                edited_text=request.POST.get("text"),
            )
    except ChoiceLocked as problem:
        error, status = str(problem), 409
    except ValueError as problem:
        error, status = str(problem), 422
    siblings_rejected = rejected_now if decision in ("approve", "edit") and not error else None
    if not request.htmx and not error:
        if siblings_rejected is not None:
            messages.success(request, _siblings_line(siblings_rejected, decision))
        return redirect("target_list", slug=slug)
    context = {
        **_base_context(request, membership),
        "group": feedback_targets_for(feedback=feedback),
        "error": error,
        "siblings_line": (
            _siblings_line(siblings_rejected, decision) if siblings_rejected is not None else ""
        ),
    }
    return render(request, "learning/targets.html#feedback-targets", context, status=status)


def _siblings_line(rejected: int, decision: str) -> str:
    action = "Saving this edit" if decision == "edit" else "Approving this"
    if not rejected:
        return f"{action} rejected no other proposal: none was left."
    return (
        f"{action} rejected {rejected} other proposal{'s' * (rejected != 1)} for the "
        "same feedback: one choice per feedback."
    )


@login_required
def retrain(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    project = membership.project
    error = ""
    form = RetrainForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        membership = get_admin_membership_for_user(request.user, slug)
        if not form.is_valid():
            error = f"mode: {'; '.join(form.errors['mode'])}"
        else:
            try:
                run = start_retrain(
                    project=project, mode=form.cleaned_data["mode"], created_by=request.user
                )
                return redirect("run_detail", slug=slug, run_id=run.pk)
            except RetrainError as problem:
                error = str(problem)
    approved = list(
        approved_targets(project)
        .select_related("feedback__trace", "feedback__reviewer", "feedback__api_key")
        .defer("feedback__trace__body", "feedback__trace__metadata")
    )
    tags = tags_by_trace({target.feedback.trace_id for target in approved})
    tag_counts = Counter(
        tag_name for target in approved for tag_name in tags.get(target.feedback.trace_id, ())
    )
    excluded = (
        DistillationTarget.objects.filter(feedback__trace__project=project)
        .exclude(state__in=(TargetState.APPROVED, TargetState.EDITED))
        .values("state")
        .annotate(count=Count("id"))
    )
    context = {
        **_base_context(request, membership),
        "approved": approved,
        "by_sender": sorted(Counter(target.feedback.sender for target in approved).items()),
        "by_tag": sorted(tag_counts.items()),
        "excluded": [(row["state"], row["count"]) for row in excluded],
        "failing_checks": sum(not target.passes_checks for target in approved),
        "open_feedback": Feedback.objects.filter(
            trace__project=project, targets__isnull=True
        ).count(),
        "runs": TrainingRun.objects.filter(project=project).order_by("-created_at")[:10],
        "unusable_feedback": unusable_feedback(project=project),
        "retrain_form": form,
        "error": error,
        "ledger": lesson_ledger(project),
        **_settings_context(project),
    }
    return render(request, "learning/retrain.html", context, status=422 if error else 200)


def _settings_context(project: Project) -> dict:
    """What a run started now would use: the training overrides, the plan it would freeze,
    and what the data policy leaves out (the training-data accounting)."""
    try:
        project_settings = settings_for(project)
    except SettingsError as problem:
        return {"settings_error": str(problem)}
    training_set = build_training_set(project=project, policy=project_settings.data_policy)
    plan = RunPlan.from_settings(
        project=project,
        project_settings=project_settings,
        targets=training_set.usable,
    )
    return {
        "training_overrides": project_settings.training.model_dump(mode="json"),
        **_plan_context(project, plan),
        "data_policy": project_settings.data_policy,
        "training_set": training_set,
    }


def _plan_context(project: Project, plan: RunPlan | None) -> dict:
    """The plan and its servers, each with whether the operator still allows it: a server
    withdrawn from MODEL_SERVERS since a run was created is not called."""
    allowed = set(allowed_upstreams(project))
    servers = [(url, url in allowed) for url in plan.upstreams] if plan else []
    return {"plan": plan, "plan_servers": servers}


@login_required
def run_detail(request: HttpRequest, slug: str, run_id: int) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    run = _get_run_for_membership(membership, run_id)
    context = {
        **_base_context(request, membership),
        "run": run,
        **_plan_context(membership.project, frozen_plan(run)),
        "presumed_dead": is_presumed_dead(run),
        "adapter": Adapter.objects.filter(run=run).first(),
        "loss_chart": line_chart(run.loss_curve, label="training loss"),
        "percent": _percent(run),
    }
    if request.htmx:
        return render(request, "learning/run.html#run-status", context)
    return render(request, "learning/run.html", context)


def _percent(run: TrainingRun) -> int:
    if run.status in ("trained", "deployed"):
        return 100
    total = run.progress.get("total_steps") or 0
    return int(100 * (run.progress.get("step") or 0) / total) if total else 0


@require_POST
@login_required
def run_cancel(request: HttpRequest, slug: str, run_id: int) -> HttpResponse:
    membership = get_admin_membership_for_user(request.user, slug)
    run = _get_run_for_membership(membership, run_id)
    request_cancel(run=run)
    return redirect("run_detail", slug=slug, run_id=run.pk)
