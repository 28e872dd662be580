"""Adapter versions: where traffic goes now, one version's lineage, and the deploy buttons."""

import json

import httpx
from django import forms
from django.contrib.auth.decorators import login_required
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from reviewapp.charts import bar_chart
from reviewapp.learning.access import get_adapter_for_membership
from reviewapp.learning.deploy import (
    DeployError,
    DeployRefused,
    deploy_adapter,
    deployment_of,
    promote_canary,
    rollback,
    set_canary_share,
)
from reviewapp.learning.lessons import lesson_ledger
from reviewapp.learning.lineage import STATUSES, adapter_lineage, adapter_report
from reviewapp.learning.models import Adapter, ModelRoute
from reviewapp.projects.access import (
    get_admin_membership_for_user,
    get_membership_for_user,
)

# A hot-load answers in well under a second; a server that takes longer than this per call is
# reported as down rather than holding the admin's page.
DEPLOY_TIMEOUT_S = 10.0


class ShareForm(forms.Form):
    """The percent of the alias's calls an adapter gets: 100 is all traffic, less is a canary."""

    def __init__(self, *args, highest: int = 100, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["share"] = forms.IntegerField(
            min_value=1, max_value=highest, label="Share of traffic (%)"
        )


def _base_context(request: HttpRequest, membership) -> dict:
    return {
        "membership": membership,
        "project": membership.project,
        "route": ModelRoute.objects.filter(project=membership.project).first(),
    }


@require_GET
@login_required
def adapter_list(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    context = _base_context(request, membership)
    # Only the report's small sections are read: a run's per-item results can be large.
    adapters = (
        Adapter.objects.filter(project=membership.project)
        .select_related("run")
        .defer("eval_results", "run__metrics", "run__log", "run__loss_curve", "run__config")
        .annotate(
            gate=KeyTransform("gate", "run__metrics"),
            counts=Coalesce(
                KeyTransform("feedback_items", "run__metrics"),
                KeyTransform("feedback_items", "eval_results"),
            ),
        )
        .order_by("-version")
    )
    context["rows"] = [
        {"adapter": adapter, "deployment": deployment_of(adapter, context["route"])}
        for adapter in adapters
    ]
    return render(request, "learning/adapters.html", context)


def _deployment_context(request: HttpRequest, membership, adapter: Adapter, **extra) -> dict:
    context = _base_context(request, membership)
    report = adapter_report(adapter)
    return {
        **context,
        "adapter": adapter,
        "deployment": deployment_of(adapter, context["route"]),
        "gate": report.get("gate") or {},
        "canary_form": ShareForm(initial={"share": 10}, highest=99),
        "share_form": ShareForm(
            initial={"share": context["route"].canary_share if context["route"] else 10},
            highest=99,
        ),
        "error": "",
        **extra,
    }


def _config_rows(config: dict) -> list[tuple[str, str]]:
    """Key and readable value: text as is, a flat mapping as "name count, ...", else JSON."""

    def readable(value) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and not any(isinstance(v, dict | list) for v in value.values()):
            return ", ".join(f"{name} {count}" for name, count in value.items()) or "none"
        return json.dumps(value)

    return [(key, readable(value)) for key, value in sorted((config or {}).items())]


def _counts(summary) -> list[int] | None:
    """A status summary as a row in STATUSES order."""
    if not isinstance(summary, dict):
        return None
    return [summary.get(status, 0) for status in STATUSES]


def _labelled(counts: list[int] | None) -> list[tuple[str, int]]:
    return list(zip(STATUSES, counts, strict=True)) if counts else []


def _status_chart(lineage) -> str:
    report = lineage.report
    sections = {
        "learned from": report.get("feedback_items"),
        "held out": (report.get("held_out") or {}).get("summary"),
        "regression prompts": (report.get("regression") or {}).get("summary"),
    }
    series = {
        name: [counts.get(status, 0) for status in STATUSES]
        for name, counts in sections.items()
        if isinstance(counts, dict)
    }
    return bar_chart(list(STATUSES), series, label="items per status") if series else ""


def _divergence_chart(lineage) -> str:
    rows = [row for row in lineage.feedback_rows if row.divergence_before is not None]
    if not rows:
        return ""
    return bar_chart(
        [f"#{index}" for index in range(1, len(rows) + 1)],
        {
            "before": [row.divergence_before for row in rows],
            "after": [row.divergence_after or 0.0 for row in rows],
        },
        label="teacher-student divergence per feedback item (nats/token)",
    )


@require_GET
@login_required
def adapter_detail(request: HttpRequest, slug: str, version: int) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    adapter = get_adapter_for_membership(membership, version)
    return render(request, "learning/adapter.html", _detail_context(request, membership, adapter))


def _detail_context(request: HttpRequest, membership, adapter: Adapter, **extra) -> dict:
    lineage = adapter_lineage(adapter)
    report = lineage.report
    return {
        **_deployment_context(request, membership, adapter, **extra),
        "lineage": lineage,
        "report": report,
        "statuses": STATUSES,
        "feedback_counts": _counts(report.get("feedback_items")),
        "held_out_counts": _labelled(_counts((report.get("held_out") or {}).get("summary"))),
        "regression_counts": _labelled(_counts((report.get("regression") or {}).get("summary"))),
        "per_tag": [
            (tag, _counts(counts)) for tag, counts in sorted((report.get("per_tag") or {}).items())
        ],
        "exclusions": _config_rows(report.get("exclusions") or {}),
        "config": _config_rows(adapter.run.config if adapter.run else {}),
        "status_chart": _status_chart(lineage),
        "divergence_chart": _divergence_chart(lineage),
        "ledger": lesson_ledger(membership.project),
    }


def _after_action(
    request: HttpRequest, membership, adapter: Adapter, *, error: str = "", status: int = 200
) -> HttpResponse:
    """htmx: the deployment block again; without JS: back to the page (or it, with the error)."""
    if request.htmx:
        context = _deployment_context(request, membership, adapter, error=error)
        return render(request, "learning/adapter.html#deployment", context, status=status)
    if error:
        context = _detail_context(request, membership, adapter, error=error)
        return render(request, "learning/adapter.html", context, status=status)
    return redirect("adapter_detail", slug=membership.project.slug, version=adapter.version)


def _form_error(form: ShareForm) -> str:
    return "; ".join(message for messages in form.errors.values() for message in messages)


def _change_route(
    request: HttpRequest, slug: str, version: int, change, form: ShareForm | None = None
) -> HttpResponse:
    """An admin's change to where an adapter's traffic goes: `change(adapter=, share=)`, the
    share from `form` when the change takes one (invalid: 422). The service refuses what the
    route does not allow (409)."""
    membership = get_admin_membership_for_user(request.user, slug)
    adapter = get_adapter_for_membership(membership, version)
    if form is not None and not form.is_valid():
        return _after_action(request, membership, adapter, error=_form_error(form), status=422)
    try:
        change(adapter=adapter, **(form.cleaned_data if form is not None else {}))
    except DeployRefused as refusal:
        return _after_action(request, membership, adapter, error=str(refusal), status=409)
    except DeployError as problem:
        error = f"The model server did not take {adapter.name}; routing is unchanged. {problem}"
        return _after_action(request, membership, adapter, error=error, status=502)
    return _after_action(request, membership, adapter)


def _deploy(*, adapter: Adapter, share: int) -> None:
    with httpx.Client(timeout=DEPLOY_TIMEOUT_S) as client:
        deploy_adapter(adapter=adapter, share=share, client=client)


@require_POST
@login_required
def adapter_deploy(request: HttpRequest, slug: str, version: int) -> HttpResponse:
    return _change_route(request, slug, version, _deploy, ShareForm(request.POST))


@require_POST
@login_required
def adapter_promote(request: HttpRequest, slug: str, version: int) -> HttpResponse:
    return _change_route(request, slug, version, promote_canary)


@require_POST
@login_required
def adapter_share(request: HttpRequest, slug: str, version: int) -> HttpResponse:
    form = ShareForm(request.POST, highest=99)  # a canary's share: all traffic is a promote
    return _change_route(request, slug, version, set_canary_share, form)


@require_POST
@login_required
def adapter_rollback(request: HttpRequest, slug: str, version: int) -> HttpResponse:
    """A canary is dropped; a primary hands the alias back to the previous primary (or base)."""
    return _change_route(request, slug, version, rollback)
