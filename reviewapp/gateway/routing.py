"""Which project a key belongs to and where its model alias points, cached briefly in-process.

The gateway answers the harness without waiting on the database when it can: a project's
routing is read at most once per CACHE_SECONDS per process.
"""

import logging
import random
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError

from reviewapp.models import Adapter, ApiKey, ModelRoute

logger = logging.getLogger(__name__)

CACHE_SECONDS = 2.0


@dataclass(frozen=True)
class GatewayProject:
    id: int
    slug: str
    served_model: str  # the alias the harness asks for
    upstream_url: str
    base_upstream_model: str
    primary: str  # upstream model name of the primary route; "" = base
    canary: str
    canary_share: int
    base_model: str = ""  # the name the adapters are trained from, as the project records it
    adapters: frozenset[str] = frozenset()  # this project's adapter versions, by name
    key_scopes: frozenset[str] = frozenset()  # what the calling key may do (ApiKey.scopes)


@dataclass(frozen=True)
class Destination:
    upstream_url: str
    upstream_model: str
    adapter_version: str  # "" when the base model answers


_cache: dict[str, tuple[float, GatewayProject | None]] = {}


async def project_for_key(secret: str) -> GatewayProject | None:
    secret_hash = ApiKey.hash_secret(secret)
    now = time.monotonic()
    cached = _cache.get(secret_hash)
    if cached and cached[0] > now:
        return cached[1]
    try:
        key = await (
            ApiKey.objects.select_related("project")
            .filter(secret_hash=secret_hash, revoked_at__isnull=True)
            .afirst()
        )
        route = await ModelRoute.objects.filter(project=key.project).afirst() if key else None
        adapters = (
            [
                name
                async for name in Adapter.objects.filter(project=key.project).values_list(
                    "name", flat=True
                )
            ]
            if key
            else []
        )
    except DatabaseError:
        if cached:  # the database is away: answer with what this process last knew
            logger.warning("routing from a stale cache: the database is unavailable")
            return cached[1]
        raise
    project = None
    if key is not None:
        p = key.project
        project = GatewayProject(
            id=p.pk,
            slug=p.slug,
            served_model=p.served_model,
            upstream_url=(p.upstream_url or settings.VLLM_URL).rstrip("/"),
            base_upstream_model=p.upstream_model or p.served_model,
            primary=route.primary if route else "",
            canary=route.canary if route else "",
            canary_share=route.canary_share if route else 0,
            base_model=p.base_model,
            adapters=frozenset(adapters),
            key_scopes=frozenset(key.scopes),
        )
    _cache[secret_hash] = (now + CACHE_SECONDS, project)
    return project


def forget_cached_key(secret_hash: str) -> None:
    """Called when a key is revoked in this process: its next gateway call reads the database.
    Other processes refuse it once their entry expires, within CACHE_SECONDS."""
    _cache.pop(secret_hash, None)


def forget_cached_routes() -> None:
    """Called after a route changes in this process; other processes catch up within seconds."""
    _cache.clear()


def destination_for(
    project: GatewayProject, requested_model: str, rng: random.Random | None = None
) -> Destination | None:
    """The alias goes to the primary route, or to the canary for its share; the base model's
    names go to the base and the project's own adapters by name. Any other name is None: a
    shared model server also serves other projects' adapters, which this key may not call."""
    # The alias first: by default it is also the base model's name, and it must follow the route.
    if requested_model != project.served_model:
        if requested_model in project.adapters:
            return Destination(project.upstream_url, requested_model, requested_model)
        if requested_model in (project.base_upstream_model, project.base_model):
            return Destination(project.upstream_url, project.base_upstream_model, "")
        return None
    target = project.primary
    share = project.canary_share if project.canary else 0
    if share and (rng or random).random() * 100 < share:
        target = project.canary
    if not target:
        return Destination(project.upstream_url, project.base_upstream_model, "")
    return Destination(project.upstream_url, target, target)
