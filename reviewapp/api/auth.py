"""Machine authentication: `Authorization: Bearer <project api key>` resolves to one project."""

from datetime import timedelta

from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from reviewapp.models import ApiKey, Project

# last_used_at is for people reading the keys page; writing it on every request would cost a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def project_for_api_key(secret: str) -> Project | None:
    """The project a live key belongs to, or None."""
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
    return key.project


class ProjectKeyAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Project | None:
        return project_for_api_key(token)
