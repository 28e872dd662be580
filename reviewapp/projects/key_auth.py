"""Machine authentication: `Authorization: Bearer <project api key>` resolves to one project.

Each route names the key scopes it accepts (`requires`); the check runs here, before the view,
and the same names are written into the OpenAPI document.
"""

from datetime import timedelta

from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from reviewapp.api.errors import MissingScope
from reviewapp.projects.models import ApiKey, KeyScope, Project

# last_used_at is for people reading the keys page; writing it on every request would cost a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def api_key_for_secret(secret: str) -> ApiKey | None:
    """The live key with this secret, its project loaded, or None."""
    key = (
        ApiKey.objects.select_related("project")
        .filter(secret_hash=ApiKey.hash_secret(secret), revoked_at__isnull=True)
        .first()
    )
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


class ProjectKeyAuth(HttpBearer):
    """`request.auth` becomes the key's project and `request.api_key` the key."""

    def __init__(self, *scopes: str):
        super().__init__()
        self.scopes = scopes

    def authenticate(self, request: HttpRequest, token: str) -> Project | None:
        key = api_key_for_secret(token)
        if key is None:
            return None
        if not any(key.has_scope(scope) for scope in self.scopes):
            raise MissingScope(self.scopes, key.scopes)
        request.api_key = key
        return key.project


def requires(*scopes: KeyScope, openapi_extra: dict | None = None) -> dict:
    """A route's keyword arguments: a key with any of `scopes` may call it, and its OpenAPI
    operation says so (description and `x-required-scopes`)."""
    names = [scope.value for scope in scopes]
    wording = " or ".join(f"`{name}`" for name in names)
    return {
        "auth": ProjectKeyAuth(*names),
        "description": f"Needs an API key with the {wording} scope.",
        "openapi_extra": {
            "x-required-scopes": names,
            **(openapi_extra or {}),
        },
    }
