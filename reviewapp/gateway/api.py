"""The gateway's own answers over the API: how many requests it refused, and why."""

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from reviewapp.api.schemas import ERRORS
from reviewapp.monitors.models import RefusalReason
from reviewapp.monitors.refusals import recent_refusals
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope

router = Router(tags=["gateway"])


class RefusalWindow(Schema):
    hours: int = Field(24, ge=1, le=24 * 90, description="this hour and the ones before it")


class RefusalOut(Schema):
    reason: RefusalReason
    count: int


class RefusalsOut(Schema):
    hours: int
    refusals: list[RefusalOut]  # most first; reasons with none are left out


@router.get(
    "/gateway/refusals",
    response={200: RefusalsOut, **ERRORS},
    summary="Requests the gateway refused before the model saw them (not stored as traces)",
    **requires(KeyScope.INGEST, KeyScope.REVIEW, KeyScope.ADMIN),
)
def list_refusals(request: HttpRequest, window: Query[RefusalWindow]):
    """Per reason: `insufficient_scope`, `model_not_found`, `invalid_request`. A key nobody
    holds names no project, so its refusals are counted but not shown to any project."""
    counts = recent_refusals(request.auth, hours=window.hours)
    return {
        "hours": window.hours,
        "refusals": [{"reason": reason, "count": count} for reason, count in counts.items()],
    }
