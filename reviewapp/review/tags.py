"""Reviewers' writes from the dashboard: tags and the taxonomy."""

from datetime import datetime

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from reviewapp.projects.models import Project
from reviewapp.traces.models import Tag, Trace, TraceTag


class TagError(ValueError):
    """A taxonomy change that would lose or tangle something; the message says what."""


@transaction.atomic
def toggle_tag(*, trace: Trace, tag: Tag, reviewer) -> bool:
    """Put the reviewer's tag on the trace, or take it off; returns whether it is now on."""
    deleted, _ = TraceTag.objects.filter(trace=trace, tag=tag, reviewer=reviewer).delete()
    if deleted:
        return False
    TraceTag.objects.get_or_create(trace=trace, tag=tag, reviewer=reviewer)
    return True


def restore_tag(*, trace: Trace, tag: Tag, reviewer, created_at: datetime) -> bool:
    """Undo taking the reviewer's tag off: it is back with the time it was first put on. False
    when it is on again already."""
    _, created = TraceTag.objects.get_or_create(
        trace=trace, tag=tag, reviewer=reviewer, defaults={"created_at": created_at}
    )
    return created


def add_tag(*, trace: Trace, tag: Tag, reviewer=None) -> bool:
    """Put the tag on the trace for the reviewer (None: an API key); True when it was not on."""
    _, created = TraceTag.objects.get_or_create(trace=trace, tag=tag, reviewer=reviewer)
    return created


@transaction.atomic
def tag_traces(*, traces: list[Trace], tag: Tag, reviewer) -> int:
    """Put the reviewer's tag on every one of the traces, all or none (the trace list's bulk
    action); returns how many did not carry it from this reviewer before."""
    if any(trace.project_id != tag.project_id for trace in traces):
        raise TagError("a tag goes on traces of its own project only")
    return sum(add_tag(trace=trace, tag=tag, reviewer=reviewer) for trace in traces)


def remove_tag(*, trace: Trace, tag: Tag, reviewer=None) -> bool:
    """Take the reviewer's tag (None: an API key's) off the trace; others' stay. True when it
    was on."""
    deleted, _ = TraceTag.objects.filter(trace=trace, tag=tag, reviewer=reviewer).delete()
    return bool(deleted)


def create_tag(
    *, project: Project, name: str, parent: Tag | None = None, description: str = ""
) -> Tag:
    return Tag.objects.create(project=project, name=name, parent=parent, description=description)


def rename_tag(*, tag: Tag, name: str) -> Tag:
    if Tag.objects.filter(project_id=tag.project_id, name=name).exclude(pk=tag.pk).exists():
        raise TagError(f"there is already a tag “{name}”: merge into it instead")
    tag.name = name
    tag.save(update_fields=["name"])
    return tag


@transaction.atomic
def merge_tag(*, source: Tag, into: Tag) -> Tag:
    """Move everything tagged `source` to `into` (each reviewer's tag once), then drop `source`.

    Its children, and the triage rules that route on it, follow it to `into`."""
    if source.project_id != into.project_id or source.pk == into.pk:
        raise TagError("merge into another tag of the same project")
    ancestor = into
    while ancestor is not None:
        if ancestor.pk == source.pk:
            raise TagError(f"“{into.name}” sits under “{source.name}”: it cannot absorb it")
        ancestor = ancestor.parent
    # A trace both tags were on by the same reviewer (or both by a machine) keeps one of them.
    on_into = TraceTag.objects.filter(tag=into, trace=OuterRef("trace"))
    TraceTag.objects.filter(tag=source).filter(
        Q(Exists(on_into.filter(reviewer=OuterRef("reviewer"))))
        | Q(Exists(on_into.filter(reviewer__isnull=True)), reviewer__isnull=True)
    ).delete()
    TraceTag.objects.filter(tag=source).update(tag=into)
    Tag.objects.filter(parent=source).update(parent=into)
    source.triage_rules.update(tag=into)
    source.delete()
    return into


@transaction.atomic
def delete_tag(*, tag: Tag) -> None:
    """Take the tag off every trace; its children move up to its parent. A tag that a triage
    rule routes on is kept: deleting it would delete the rule."""
    rules = list(tag.triage_rules.values_list("name", flat=True))
    if rules:
        raise TagError(f"triage rule “{rules[0]}” routes on it: merge it, or change the rule")
    Tag.objects.filter(parent=tag).update(parent=tag.parent)
    tag.delete()
