"""Saved views: trace-list filters a reviewer named, kept private or shared with the project."""

from django.db import IntegrityError, transaction

from reviewapp.projects.models import Project
from reviewapp.traces.models import SavedView


class SavedViewError(ValueError):
    """A view that cannot be saved; the message says why, to the person saving it."""


def save_view(*, project: Project, owner, name: str, query: str, shared: bool) -> SavedView:
    """Store the filters in `query` (a trace-list query string) under `name`; the owner has one
    view of each name, whatever its case."""
    duplicate = f"you already have a view named “{name}”: pick another name"
    if SavedView.objects.filter(project=project, owner=owner, name__iexact=name).exists():
        raise SavedViewError(duplicate)
    try:
        with transaction.atomic():
            return SavedView.objects.create(
                project=project, owner=owner, name=name, query=query, shared=shared
            )
    except IntegrityError as error:  # the same name saved twice at once
        raise SavedViewError(duplicate) from error
