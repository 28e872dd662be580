"""A project's adapters, looked up for a member (projects.access: another project's adapter
does not exist here)."""

from reviewapp.learning.models import Adapter
from reviewapp.projects.access import first_or_404
from reviewapp.projects.models import Membership


def get_adapter_for_membership(membership: Membership, version: int) -> Adapter:
    adapters = Adapter.objects.select_related("run").filter(
        project=membership.project, version=version
    )
    return first_or_404(adapters, "no such adapter")
