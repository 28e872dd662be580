from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from reviewapp.api.app import api
from reviewapp.gateway import views as gateway
from reviewapp.learning.views import adapters, training
from reviewapp.monitors.views import monitors, triage
from reviewapp.projects.views import invitations, members
from reviewapp.projects.views import keys as api_keys
from reviewapp.projects.views import settings as project_settings
from reviewapp.review.views import bulk, queues
from reviewapp.review.views import tags as projects
from reviewapp.traces import views as traces

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

urlpatterns = [
    path("", traces.home, name="home"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(f"{project}traces/", traces.trace_list, name="trace_list"),
    path(f"{project}traces/views/", traces.saved_view_create, name="saved_view_create"),
    path(
        f"{project}traces/views/<int:view_id>/delete/",
        traces.saved_view_delete,
        name="saved_view_delete",
    ),
    path(f"{project}traces/bulk/tag/", bulk.traces_bulk_tag, name="traces_bulk_tag"),
    path(f"{project}traces/bulk/queue/", bulk.traces_bulk_queue, name="traces_bulk_queue"),
    path(f"{project}traces/bulk/feedback/", bulk.traces_bulk_feedback, name="traces_bulk_feedback"),
    path(f"{trace}", traces.trace_detail, name="trace_detail"),
    path(f"{trace}tags/<int:tag_id>/", traces.trace_toggle_tag, name="trace_toggle_tag"),
    path(f"{trace}tags/undo/", traces.trace_undo_untag, name="trace_undo_untag"),
    path(f"{trace}feedback/", traces.trace_add_feedback, name="trace_add_feedback"),
    path(f"{feedback}delete/", traces.feedback_delete, name="feedback_delete"),
    path(
        f"{trace}feedback/undo/<int:deleted_id>/",
        traces.feedback_undo_delete,
        name="feedback_undo_delete",
    ),
    path(f"{feedback}retry/", traces.feedback_retry, name="feedback_retry"),
    path(f"{feedback}correct/", traces.feedback_correct, name="feedback_correct"),
    path(f"{trace}similar/", triage.trace_similar, name="trace_similar"),
    path(f"{trace}similar/apply/", triage.trace_apply_feedback, name="trace_apply_feedback"),
    path(f"{project}triage/", triage.triage_rules, name="triage_rules"),
    path(f"{rule}", triage.triage_rule_edit, name="triage_rule_edit"),
    path(f"{rule}run/", triage.triage_rule_run, name="triage_rule_run"),
    path(f"{project}triage/clusters/", triage.failure_clusters_page, name="failure_clusters"),
    path(f"{project}tags/", projects.tag_list, name="tag_list"),
    path(f"{tag}rename/", projects.tag_rename, name="tag_rename"),
    path(f"{tag}merge/", projects.tag_merge, name="tag_merge"),
    path(f"{tag}delete/", projects.tag_delete, name="tag_delete"),
    path(f"{project}keys/", api_keys.api_keys, name="api_keys"),
    path(f"{project}keys/<int:key_id>/revoke/", api_keys.api_key_revoke, name="api_key_revoke"),
    path(f"{project}settings/", project_settings.project_settings, name="project_settings"),
    path(f"{project}members/", members.members, name="members"),
    path(f"{project}members/invite/", invitations.invitation_create, name="invitation_create"),
    path(
        f"{project}invitations/<int:invitation_id>/revoke/",
        invitations.invitation_revoke,
        name="invitation_revoke",
    ),
    path("invite/<str:token>/", invitations.invitation_accept, name="invitation_accept"),
    path(f"{member}role/", members.member_role, name="member_role"),
    path(f"{member}remove/", members.member_remove, name="member_remove"),
    path(f"{project}queues/", queues.queue_list, name="queue_list"),
    path(f"{project}queues/new/", queues.queue_create, name="queue_create"),
    path(f"{queue}", queues.queue_detail, name="queue_detail"),
    path(f"{queue}next/", queues.queue_next, name="queue_next"),
    path(f"{queue}items/<int:item_id>/done/", queues.queue_item_done, name="queue_item_done"),
    path(
        f"{queue}items/<int:item_id>/release/",
        queues.queue_item_release,
        name="queue_item_release",
    ),
    path(
        f"{queue}items/<int:item_id>/reassign/",
        queues.queue_item_reassign,
        name="queue_item_reassign",
    ),
    path(f"{queue}guidelines/", queues.queue_guidelines, name="queue_guidelines"),
    path(f"{queue}agreement/", queues.queue_agreement, name="queue_agreement"),
    path(f"{targets}", training.target_list, name="target_list"),
    path(f"{targets}policy/", training.target_policy, name="target_policy"),
    path(
        f"{targets}approve-passing/",
        training.target_approve_passing,
        name="target_approve_passing",
    ),
    path(f"{targets}feedback/<int:feedback_id>/", training.target_choice, name="target_choice"),
    path(f"{project}retrain/", training.retrain, name="retrain"),
    path(f"{project}runs/<int:run_id>/", training.run_detail, name="run_detail"),
    path(f"{project}runs/<int:run_id>/cancel/", training.run_cancel, name="run_cancel"),
    path(f"{project}adapters/", adapters.adapter_list, name="adapter_list"),
    path(f"{adapter}", adapters.adapter_detail, name="adapter_detail"),
    path(f"{adapter}deploy/", adapters.adapter_deploy, name="adapter_deploy"),
    path(f"{adapter}promote/", adapters.adapter_promote, name="adapter_promote"),
    path(f"{adapter}share/", adapters.adapter_share, name="adapter_share"),
    path(f"{adapter}rollback/", adapters.adapter_rollback, name="adapter_rollback"),
    path(f"{project}monitors/", monitors.monitors, name="monitors"),
    path(f"{project}dataset/", monitors.dataset, name="dataset"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # The recording gateway: OpenAI-compatible, so a harness only changes its base URL.
    path("v1/chat/completions", gateway.chat_completions, name="gateway_chat"),
    path("v1/models", gateway.list_models, name="gateway_models"),
]
