"""The trace list: filters and search, saved views, the first-run steps, and the home page that
leads to it."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Exists, OuterRef, Prefetch
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from reviewapp.fragments import render_page
from reviewapp.projects.access import (
    get_membership_for_user,
    get_reviewer_membership_for_user,
    projects_for_user,
)
from reviewapp.projects.models import Membership, Project
from reviewapp.review.forms import (
    BulkActionForm,
    BulkFeedbackForm,
    BulkQueueForm,
    BulkTagForm,
)
from reviewapp.review.models import Feedback, QueueReview, ReviewStatus
from reviewapp.traces.access import (
    get_saved_view_for_membership,
    saved_views_for_membership,
)
from reviewapp.traces.filters import (
    TraceFilterForm,
    after_cursor,
    cursor_for,
    filter_query,
    filtered_traces,
    search_matches,
)
from reviewapp.traces.forms import SavedViewForm
from reviewapp.traces.models import SavedView, Trace, TraceTag
from reviewapp.traces.saved_views import SavedViewError, save_view

PAGE_SIZE = 50


@login_required
def home(request: HttpRequest) -> HttpResponse:
    projects = projects_for_user(request.user)
    if len(projects) == 1:
        return redirect("trace_list", slug=projects[0].slug)
    return render(request, "projects/index.html", {"projects": projects})


@require_GET
@login_required
def trace_list(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    return render_trace_list(request, membership, request.GET)


def render_trace_list(
    request: HttpRequest,
    membership: Membership,
    query: QueryDict,
    *,
    status: int = 200,
    saved_view_form: SavedViewForm | None = None,
    bulk_form: BulkActionForm | None = None,
) -> HttpResponse:
    """The trace list for the filters in `query` (the page, its results for an htmx filter
    request, or the next rows). A saved view or bulk action that failed comes back through
    here with its bound form, its errors shown, at `status`."""
    project = membership.project
    form = TraceFilterForm(query or None, project=project)
    filters = form.cleaned_data if form.is_valid() else {}
    sort = filters.get("sort") or "newest"
    traces = filtered_traces(project, filters)
    if query.get("cursor"):
        traces = after_cursor(traces, sort, query["cursor"])
    page = list(
        traces.defer("body", "metadata", "search_text")
        .annotate(feedback_count=Count("feedback"))
        .prefetch_related(Prefetch("trace_tags", TraceTag.objects.select_related("tag")))[
            : PAGE_SIZE + 1
        ]
    )
    next_query = None
    if len(page) > PAGE_SIZE:
        page = page[:PAGE_SIZE]
        more = query.copy()
        more["cursor"] = cursor_for(page[-1], sort)
        next_query = more.urlencode()
    if filters.get("q"):  # where each listed trace matched, for this page's rows only
        matches = search_matches(page, filters["q"])
        for trace in page:
            trace.search_match = matches.get(trace.pk)
    context = {
        "membership": membership,
        "project": project,
        "form": form,
        "traces": page,
        "next_query": next_query,
        "filter_query": filter_query(query),
        "bulk_form": bulk_form,
        # A refused bulk action shows the list with the same traces ticked.
        "selected_ids": {trace.pk for trace in bulk_form.traces} if bulk_form else set(),
    }
    if request.htmx and request.htmx.target == "more-row":
        return render(request, "workbench/trace_list.html#trace-rows", context, status=status)
    context.update(
        _list_forms(
            membership,
            context["filter_query"],
            saved_view_form=saved_view_form,
            bulk_form=bulk_form,
        )
    )
    context["saved_views"] = saved_views_for_membership(membership)
    if not request.htmx:
        context["first_run"] = first_run_steps(project)
    # Every trace the filters match, not the page's: the figure a monitor link promises.
    context["matching"] = filtered_traces(project, filters).count()
    return render_page(
        request, "workbench/trace_list.html", context, fragment="trace-results", status=status
    )


def _list_forms(
    membership: Membership,
    query: str,
    *,
    saved_view_form: SavedViewForm | None,
    bulk_form: BulkActionForm | None,
) -> dict:
    """The list's own forms for a reviewer: save the filters as a view, act on ticked traces.
    The one that just failed comes back bound, with its errors."""
    if not membership.can_review:
        return {}
    project = membership.project

    def bulk(form_class: type[BulkActionForm]) -> BulkActionForm:
        if isinstance(bulk_form, form_class):
            return bulk_form
        return form_class(project=project, traces=[])

    forms = {
        "saved_view_form": saved_view_form
        or SavedViewForm(initial={"query": query}, project=project, prefix="view"),
        "bulk_tag_form": bulk(BulkTagForm),
        "bulk_feedback_form": bulk(BulkFeedbackForm),
    }
    if membership.is_admin:  # admins manage queues; reviewers work them
        forms["bulk_queue_form"] = bulk(BulkQueueForm)
    return forms


@require_POST
@login_required
def saved_view_create(request: HttpRequest, slug: str) -> HttpResponse:
    """Name the list's current filters; the list then offers them as a link."""
    membership = get_reviewer_membership_for_user(request.user, slug)
    form = SavedViewForm(request.POST, project=membership.project, prefix="view")
    if form.is_valid():
        try:
            saved = save_view(project=membership.project, owner=request.user, **form.cleaned_data)
        except SavedViewError as error:
            form.add_error("name", str(error))
    if form.errors:
        filters = QueryDict(request.POST.get("view-query", ""))
        return render_trace_list(request, membership, filters, saved_view_form=form, status=422)
    messages.success(
        request, f"Saved the view “{saved.name}”{' for the project' if saved.shared else ''}."
    )
    return redirect(trace_list_url(membership.project, saved.query))


def _get_deletable_saved_view_for_user(
    user, slug: str, view_id: int
) -> tuple[Membership, SavedView]:
    """A view its owner deletes, or a project admin when it is shared; another's private
    view does not exist."""
    membership = get_membership_for_user(user, slug)
    saved = get_saved_view_for_membership(membership, view_id)
    if saved.owner_id != user.pk and not membership.is_admin:
        raise PermissionDenied("only its owner or a project admin can delete a shared view")
    return membership, saved


@require_POST
@login_required
def saved_view_delete(request: HttpRequest, slug: str, view_id: int) -> HttpResponse:
    membership, saved = _get_deletable_saved_view_for_user(request.user, slug, view_id)
    saved.delete()
    messages.success(request, f"Deleted the view “{saved.name}”.")
    return redirect(trace_list_url(membership.project, request.POST.get("filters", "")))


def trace_list_url(project: Project, query: str) -> str:
    """The trace list filtered by the filter fields of `query` (a query string; the forms
    that post from the list send theirs as `filters`)."""
    page = reverse("trace_list", args=[project.slug])
    filters = filter_query(QueryDict(query))
    return f"{page}?{filters}" if filters else page


def first_run_steps(project: Project) -> list[dict] | None:
    """A new or demo project's way to its first adapter, each step ticked from what the
    database holds; None once every step is done. One query."""
    traces = Trace.objects.filter(project=OuterRef("pk"))
    done = (
        Project.objects.filter(pk=project.pk)
        .annotate(
            sent=Exists(traces),
            reviewed=Exists(
                TraceTag.objects.filter(trace__project=OuterRef("pk"), reviewer__isnull=False)
            )
            | Exists(
                QueueReview.objects.filter(
                    item__queue__project=OuterRef("pk"), status=ReviewStatus.DONE
                )
            ),
            wrote=Exists(Feedback.objects.filter(trace__project=OuterRef("pk"))),
            retrained=Exists(Project.objects.filter(pk=OuterRef("pk"), runs__isnull=False)),
        )
        .values("sent", "reviewed", "wrote", "retrained")
        .get()
    )
    if all(done.values()):
        return None
    return [{"key": key, "done": done[key]} for key in ("sent", "reviewed", "wrote", "retrained")]
