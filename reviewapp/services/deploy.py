"""Putting an adapter in front of the harness, and taking it away again."""

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.models import Adapter, ModelRoute, Project
from training.deploy import DeployError, canary_request, load_adapter


def upstreams_for(project: Project) -> list[str]:
    return [(project.upstream_url or settings.VLLM_URL).rstrip("/")]


def deploy_adapter(*, adapter: Adapter, share: int = 100, client: httpx.Client | None = None):
    """Load on every upstream, send a canary request, then route `share`% of the alias to it.

    Raises DeployError with routing unchanged when any step fails.
    """
    if not 0 < share <= 100:
        raise ValueError("share must be between 1 and 100")
    project = adapter.project
    client = client or httpx.Client(timeout=60)
    urls = upstreams_for(project)
    load_adapter(client, urls, name=adapter.name, path=adapter.path)
    for url in urls:
        canary_request(client, url, model=adapter.name)
    _route_to(adapter=adapter, share=share)


@transaction.atomic
def _route_to(*, adapter: Adapter, share: int) -> None:
    route, _ = ModelRoute.objects.select_for_update().get_or_create(project=adapter.project)
    if share == 100:
        route.previous_primary = route.primary
        route.primary, route.canary, route.canary_share = adapter.name, "", 0
    else:
        route.canary, route.canary_share = adapter.name, share
    route.updated_at = timezone.now()
    route.save()
    transaction.on_commit(forget_cached_routes)


@transaction.atomic
def promote_canary(*, project: Project) -> None:
    route = ModelRoute.objects.select_for_update().get(project=project)
    if not route.canary:
        raise DeployError("there is no canary to promote")
    route.previous_primary = route.primary
    route.primary, route.canary, route.canary_share = route.canary, "", 0
    route.updated_at = timezone.now()
    route.save()
    transaction.on_commit(forget_cached_routes)


@transaction.atomic
def rollback(*, project: Project) -> None:
    """Drop the canary if there is one; otherwise go back to the previous primary."""
    route = ModelRoute.objects.select_for_update().filter(project=project).first()
    if route is None:
        return
    if route.canary:
        route.canary, route.canary_share = "", 0
    else:
        route.primary, route.previous_primary = route.previous_primary, ""
    route.updated_at = timezone.now()
    route.save()
    transaction.on_commit(forget_cached_routes)


@transaction.atomic
def set_canary_share(*, project: Project, share: int) -> None:
    """Send `share`% of the alias to the canary; promoting or dropping it are other buttons."""
    if not 0 < share < 100:
        raise ValueError("a canary share is between 1 and 99 percent")
    route = ModelRoute.objects.select_for_update().filter(project=project).first()
    if route is None or not route.canary:
        raise DeployError("there is no canary to change the share of")
    route.canary_share = share
    route.updated_at = timezone.now()
    route.save()
    transaction.on_commit(forget_cached_routes)
