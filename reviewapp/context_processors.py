"""What every dashboard page's top bar needs, so no view builds it."""

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from reviewapp.projects.access import projects_for_user


def nav(request: HttpRequest) -> dict:
    """The project switcher's list; queried only when a page shows it (htmx fragments do not)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"projects": SimpleLazyObject(lambda: projects_for_user(user))}
