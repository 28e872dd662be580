"""A project's settings over the API: read them, change whole sections (admin keys only)."""

from typing import Any

from django.http import HttpRequest
from ninja import Body, Router
from ninja.errors import HttpError

from reviewapp.api.schemas import ERRORS
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope
from reviewapp.projects.project_settings import SettingsError, settings_for, update_settings

router = Router(tags=["settings"])


@router.get(
    "/settings",
    response={200: dict[str, Any], **ERRORS},
    summary="The project's settings, defaults filled in",
    **requires(KeyScope.ADMIN),
)
def get_settings(request: HttpRequest):
    try:
        return settings_for(request.auth).model_dump(mode="json")
    except SettingsError as error:
        raise HttpError(409, f"the stored settings are invalid: {error}") from None


@router.patch(
    "/settings",
    response={200: dict[str, Any], **ERRORS},
    summary="Replace some sections (training, gate, data_policy, auto_approve, ...)",
    **requires(KeyScope.ADMIN),
)
def patch_settings(request: HttpRequest, changes: Body[dict[str, Any]]):
    """All valid or none stored; a bad value is answered 422 naming the field."""
    try:
        return update_settings(project=request.auth, changes=changes).model_dump(mode="json")
    except SettingsError as error:
        raise HttpError(422, str(error)) from None
