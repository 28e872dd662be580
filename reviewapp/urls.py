from collections.abc import Callable

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponse
from django.urls import URLPattern, path

from reviewapp.api.app import api
from reviewapp.gateway import views as gateway
from reviewapp.learning.views import adapters, training
from reviewapp.monitors.views import monitors, triage
from reviewapp.projects.views import invitations, members
from reviewapp.projects.views import keys as api_keys
from reviewapp.projects.views import settings as project_settings
from reviewapp.review.views import queues
from reviewapp.review.views import tags as projects
from reviewapp.workbench import bulk, trace_list, trace_page

# A project's pages; the parts of their paths they share are written once.
project = "p/<slug:slug>/"
trace = f"{project}traces/<int:trace_id>/"
feedback = f"{trace}feedback/<int:feedback_id>/"
rule = f"{project}triage/rules/<int:rule_id>/"
tag = f"{project}tags/<int:tag_id>/"
member = f"{project}members/<int:member_id>/"
queue = f"{project}queues/<int:queue_id>/"
adapter = f"{project}adapters/<int:version>/"
targets = f"{project}targets/"


def page(route: str, view: Callable[..., HttpResponse]) -> URLPattern:
    """A page named after its view: the name that templates and redirects reverse."""
    return path(route, view, name=view.__name__)


urlpatterns = [
    page("", trace_list.home),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    page(f"{project}traces/", trace_list.trace_list),
    page(f"{project}traces/views/", trace_list.saved_view_create),
    page(f"{project}traces/views/<int:view_id>/delete/", trace_list.saved_view_delete),
    page(f"{project}traces/bulk/tag/", bulk.traces_bulk_tag),
    page(f"{project}traces/bulk/queue/", bulk.traces_bulk_queue),
    page(f"{project}traces/bulk/feedback/", bulk.traces_bulk_feedback),
    page(f"{trace}", trace_page.trace_detail),
    page(f"{trace}tags/<int:tag_id>/", trace_page.trace_toggle_tag),
    page(f"{trace}tags/undo/", trace_page.trace_undo_untag),
    page(f"{trace}feedback/", trace_page.trace_add_feedback),
    page(f"{feedback}delete/", trace_page.feedback_delete),
    page(f"{trace}feedback/undo/<int:deleted_id>/", trace_page.feedback_undo_delete),
    page(f"{feedback}retry/", trace_page.feedback_retry),
    page(f"{feedback}correct/", trace_page.feedback_correct),
    page(f"{trace}similar/", triage.trace_similar),
    page(f"{trace}similar/apply/", triage.trace_apply_feedback),
    page(f"{project}triage/", triage.triage_rules),
    page(f"{rule}", triage.triage_rule_edit),
    page(f"{rule}run/", triage.triage_rule_run),
    path(f"{project}triage/clusters/", triage.failure_clusters_page, name="failure_clusters"),
    page(f"{project}tags/", projects.tag_list),
    page(f"{tag}rename/", projects.tag_rename),
    page(f"{tag}merge/", projects.tag_merge),
    page(f"{tag}delete/", projects.tag_delete),
    page(f"{project}keys/", api_keys.api_keys),
    page(f"{project}keys/<int:key_id>/revoke/", api_keys.api_key_revoke),
    page(f"{project}settings/", project_settings.project_settings),
    page(f"{project}members/", members.members),
    page(f"{project}members/invite/", invitations.invitation_create),
    page(f"{project}invitations/<int:invitation_id>/revoke/", invitations.invitation_revoke),
    page("invite/<str:token>/", invitations.invitation_accept),
    page(f"{member}role/", members.member_role),
    page(f"{member}remove/", members.member_remove),
    page(f"{project}queues/", queues.queue_list),
    page(f"{project}queues/new/", queues.queue_create),
    page(f"{queue}", queues.queue_detail),
    page(f"{queue}next/", queues.queue_next),
    page(f"{queue}items/<int:item_id>/done/", queues.queue_item_done),
    page(f"{queue}items/<int:item_id>/release/", queues.queue_item_release),
    page(f"{queue}items/<int:item_id>/reassign/", queues.queue_item_reassign),
    page(f"{queue}guidelines/", queues.queue_guidelines),
    page(f"{queue}agreement/", queues.queue_agreement),
    page(f"{targets}", training.target_list),
    page(f"{targets}policy/", training.target_policy),
    page(f"{targets}approve-passing/", training.target_approve_passing),
    page(f"{targets}feedback/<int:feedback_id>/", training.target_choice),
    page(f"{project}retrain/", training.retrain),
    page(f"{project}runs/<int:run_id>/", training.run_detail),
    page(f"{project}runs/<int:run_id>/cancel/", training.run_cancel),
    page(f"{project}adapters/", adapters.adapter_list),
    page(f"{adapter}", adapters.adapter_detail),
    page(f"{adapter}deploy/", adapters.adapter_deploy),
    page(f"{adapter}promote/", adapters.adapter_promote),
    page(f"{adapter}share/", adapters.adapter_share),
    page(f"{adapter}rollback/", adapters.adapter_rollback),
    page(f"{project}monitors/", monitors.monitors),
    page(f"{project}dataset/", monitors.dataset),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # The recording gateway: OpenAI-compatible, so a harness only changes its base URL.
    path("v1/chat/completions", gateway.chat_completions, name="gateway_chat"),
    path("v1/models", gateway.list_models, name="gateway_models"),
]
