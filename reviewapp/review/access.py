"""A project's queues and tags, looked up for a member (projects.access: another project's row
does not exist here)."""

from reviewapp.projects.access import first_or_404
from reviewapp.projects.models import Membership
from reviewapp.review.models import Queue
from reviewapp.traces.models import Tag


def get_queue_for_membership(membership: Membership, queue_id: int) -> Queue:
    return first_or_404(
        Queue.objects.filter(project=membership.project, pk=queue_id), "no such queue"
    )


def get_tag_for_membership(membership: Membership, tag_id: int) -> Tag:
    return first_or_404(Tag.objects.filter(project=membership.project, pk=tag_id), "no such tag")
