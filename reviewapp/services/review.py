"""Reviewers' writes from the dashboard: tags and the taxonomy."""

from django.db import transaction

from reviewapp.models import Project, Tag, Trace, TraceTag


@transaction.atomic
def toggle_tag(*, trace: Trace, tag: Tag, reviewer) -> bool:
    """Put the reviewer's tag on the trace, or take it off; returns whether it is now on."""
    deleted, _ = TraceTag.objects.filter(trace=trace, tag=tag, reviewer=reviewer).delete()
    if deleted:
        return False
    TraceTag.objects.get_or_create(trace=trace, tag=tag, reviewer=reviewer)
    return True


def create_tag(
    *, project: Project, name: str, parent: Tag | None = None, description: str = ""
) -> Tag:
    return Tag.objects.create(project=project, name=name, parent=parent, description=description)
