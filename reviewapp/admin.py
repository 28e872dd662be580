from django.contrib import admin

from reviewapp.projects.models import ApiKey, Project
from reviewapp.projects.services import revoke_api_key
from reviewapp.review.models import Feedback
from reviewapp.traces.models import Tag, Trace, TraceTag


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "served_model", "base_model", "upstream_url", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "project", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["project"]
    # The hash is useless to a person and the secret is never stored.
    exclude = ["secret_hash"]
    # Revoking goes through the action, so the gateway's cache forgets the key at once.
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # keys are made by create_api_key, which shows the secret once

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset) -> None:
        for key in queryset:
            revoke_api_key(key=key)


@admin.register(Trace)
class TraceAdmin(admin.ModelAdmin):
    list_display = ["external_id", "project", "source", "model", "termination", "received_at"]
    list_filter = ["project", "source", "termination"]
    search_fields = ["external_id", "preview"]
    exclude = ["body"]
    readonly_fields = ["content_hash", "message_count", "tool_call_count", "preview"]
    show_full_result_count = False  # counting a million rows on every page load is slow


@admin.register(Tag)
class TagAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "parent"]
    list_filter = ["project"]


@admin.register(TraceTag)
class TraceTagAdmin(admin.ModelAdmin):
    list_display = ["trace", "tag", "reviewer", "created_at"]
    raw_id_fields = ["trace"]


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    list_display = ["trace", "turn", "tool_call_id", "author", "status", "created_at"]
    list_filter = ["status"]
    raw_id_fields = ["trace"]
