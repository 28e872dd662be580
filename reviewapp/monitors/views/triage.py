"""Triage: rules that route traces to queues, failure clusters, and "more like this" on a trace."""

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from reviewapp import jobs
from reviewapp.fragments import render_page
from reviewapp.monitors.forms import CONDITION_FIELDS, ApplyFeedbackForm, TriageRuleForm
from reviewapp.monitors.models import TriageRule
from reviewapp.monitors.similarity import (
    apply_feedback_to_traces,
    failure_clusters,
    similar_traces,
    suggested_tags,
)
from reviewapp.monitors.triage import ANY_TOOL, rules_with_counts, save_rule
from reviewapp.projects.access import (
    get_admin_membership_for_user,
    get_membership_for_user,
    get_reviewer_membership_for_user,
)
from reviewapp.projects.models import Membership
from reviewapp.review.queues import blinds_reviewer
from reviewapp.traces.access import get_trace_for_membership
from reviewapp.traces.models import Trace, TraceTag

SIMILAR_SHOWN = 10
MAX_CLUSTERS = 30


def _get_rule_for_admin(user, slug: str, rule_id: int) -> tuple[Membership, TriageRule]:
    membership = get_admin_membership_for_user(user, slug)
    rule = TriageRule.objects.filter(project=membership.project, pk=rule_id).first()
    if rule is None:
        raise Http404("no such rule")
    return membership, rule


def _page(membership: Membership, **context) -> dict:
    return {"membership": membership, "project": membership.project, **context}


def describe_rule(rule: TriageRule) -> list[str]:
    """The rule's conditions in words, for the list."""
    words = {
        "termination": f"termination is {rule.termination}",
        "min_tool_calls": f"more than {rule.min_tool_calls} tool calls",
        "failed_tool": "any tool failed"
        if rule.failed_tool == ANY_TOOL
        else f"tool {rule.failed_tool} failed",
        "tag": f"tagged {rule.tag}",
        "model": f"model {rule.model}",
        "adapter_version": f"adapter {rule.adapter_version}",
        "outcome": f"outcome {rule.outcome}",
        "text": f"text contains “{rule.text}”",
    }
    return [words[name] for name in CONDITION_FIELDS if getattr(rule, name) not in (None, "")]


def _rules_context(membership: Membership, **context) -> dict:
    rules = [(rule, describe_rule(rule)) for rule in rules_with_counts(membership.project)]
    return _page(membership, rules=rules, **context)


@login_required
def triage_rules(request: HttpRequest, slug: str) -> HttpResponse:
    """Everyone sees the rules and what they matched; admins add one."""
    membership = get_membership_for_user(request.user, slug)
    form = TriageRuleForm(project=membership.project)
    if request.method == "POST":
        membership = get_admin_membership_for_user(request.user, slug)
        form = TriageRuleForm(request.POST, project=membership.project)
        if form.is_valid():
            save_rule(
                rule=form.save(commit=False),
                new_queue_name=form.cleaned_data["new_queue"],
                author=request.user,
            )
            return _back_to_rules(request, slug)
        context = _rules_context(membership, form=form, action=request.path)
        template = "monitors/_rule_form.html" if request.htmx else "monitors/rules.html"
        return render(request, template, context, status=422)
    context = _rules_context(membership, form=form, action=request.path)
    return render(request, "monitors/rules.html", context)


def _back_to_rules(request: HttpRequest, slug: str) -> HttpResponse:
    if request.htmx:
        return HttpResponseClientRedirect(reverse("triage_rules", args=[slug]))
    return redirect("triage_rules", slug=slug)


@login_required
def triage_rule_edit(request: HttpRequest, slug: str, rule_id: int) -> HttpResponse:
    membership, rule = _get_rule_for_admin(request.user, slug, rule_id)
    form = TriageRuleForm(instance=rule, project=membership.project)
    status = 200
    if request.method == "POST":
        form = TriageRuleForm(request.POST, instance=rule, project=membership.project)
        if form.is_valid():
            save_rule(
                rule=form.save(commit=False),
                new_queue_name=form.cleaned_data["new_queue"],
                conditions_changed=bool(
                    {*CONDITION_FIELDS, "sample_rate"} & set(form.changed_data)
                ),
            )
            return _back_to_rules(request, slug)
        status = 422
    context = _page(membership, form=form, rule=rule, action=request.path)
    if request.htmx:
        return render(request, "monitors/_rule_form.html", context, status=status)
    return render(request, "monitors/rule_edit.html", context, status=status)


@require_POST
@login_required
def triage_rule_run(request: HttpRequest, slug: str, rule_id: int) -> HttpResponse:
    """Run now: the worker applies the rule to every stored trace it has not looked at."""
    membership, rule = _get_rule_for_admin(request.user, slug, rule_id)
    if not rule.enabled:
        return HttpResponse("enable the rule before running it", status=409)
    jobs.enqueue_on_commit(jobs.RUN_TRIAGE_RULE, rule.pk)
    context = _rules_context(membership, running=rule)
    if request.htmx:
        return render(request, "monitors/rules.html#rule-table", context)
    return redirect("triage_rules", slug=slug)


@require_GET
@login_required
def failure_clusters_page(request: HttpRequest, slug: str) -> HttpResponse:
    """Failing traces and their feedback, grouped by meaning; ?clusters= picks how many."""
    membership = get_membership_for_user(request.user, slug)
    try:
        count = min(max(int(request.GET.get("clusters") or 0), 0), MAX_CLUSTERS) or None
    except ValueError:
        count = None
    grouped = failure_clusters(project=membership.project, clusters=count)
    context = _page(
        membership,
        clusters=grouped.clusters,
        clustered=sum(cluster.size for cluster in grouped.clusters),
        older_left_out=grouped.older_left_out,
        chosen=count,
        max_clusters=MAX_CLUSTERS,
    )
    return render(request, "monitors/clusters.html", context)


def _similar_context(request: HttpRequest, membership: Membership, trace: Trace, **extra) -> dict:
    similar = similar_traces(trace=trace, limit=SIMILAR_SHOWN)
    suggestions = []
    # A blind reviewer's judgement stays their own: no hints from others' tags.
    if membership.can_review and not blinds_reviewer(trace=trace, reviewer=request.user):
        mine = set(
            TraceTag.objects.filter(trace=trace, reviewer=request.user).values_list(
                "tag_id", flat=True
            )
        )
        suggestions = [s for s in suggested_tags(trace=trace) if s.tag.pk not in mine]
    return _page(
        membership,
        trace=trace,
        similar=similar,
        suggestions=suggestions,
        feedback_list=list(trace.feedback.order_by("id")),
        **extra,
    )


@require_GET
@login_required
def trace_similar(request: HttpRequest, slug: str, trace_id: int) -> HttpResponse:
    """More like this, and suggested tags; the trace page loads it as a fragment."""
    membership = get_membership_for_user(request.user, slug)
    trace = get_trace_for_membership(membership, trace_id)
    context = _similar_context(request, membership, trace)
    return render_page(request, "monitors/similar.html", context, fragment="similar-traces")


@require_POST
@login_required
def trace_apply_feedback(request: HttpRequest, slug: str, trace_id: int) -> HttpResponse:
    """Copy one of this trace's feedback onto the similar traces the reviewer confirmed."""
    membership = get_reviewer_membership_for_user(request.user, slug)
    trace = get_trace_for_membership(membership, trace_id)
    form = ApplyFeedbackForm(request.POST, trace=trace)
    if not form.is_valid():
        context = _similar_context(request, membership, trace, apply_form=form)
        return render(request, "monitors/similar.html#similar-traces", context, status=422)
    applied = apply_feedback_to_traces(
        feedback=form.cleaned_data["feedback"],
        traces=list(form.cleaned_data["traces"]),
        reviewer=request.user,
    )
    context = _similar_context(request, membership, trace, applied=applied)
    return render_page(request, "monitors/similar.html", context, fragment="similar-traces")
