"""Which project a key belongs to, where its model alias points and which model servers are up.

The gateway answers the harness without waiting on the database when it can: a project's
routing is read at most once per key_cache.CACHE_SECONDS per process. Model server health is
what this process saw of recent calls: a server that failed is skipped for a cooldown, then
tried again.
"""

import itertools
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection

from reviewapp.learning.models import Adapter, ModelRoute
from reviewapp.projects import key_cache
from reviewapp.projects.models import ApiKey, Project
from reviewapp.projects.project_settings import settings_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayProject:
    id: int
    slug: str
    served_model: str  # the alias the harness asks for
    upstream_urls: tuple[str, ...]  # the model servers, all serving the same base and adapters
    base_upstream_model: str
    primary: str  # upstream model name of the primary route; "" = base
    canary: str
    canary_share: int
    base_model: str = ""  # the name the adapters are trained from, as the project records it
    adapters: Mapping[str, str] = field(default_factory=dict)  # adapter version -> its path
    key_scopes: frozenset[str] = frozenset()  # what the calling key may do (ApiKey.scopes)


@dataclass(frozen=True)
class Destination:
    upstream_urls: tuple[str, ...]
    upstream_model: str
    adapter_version: str  # "" when the base model answers
    adapter_path: str = ""  # where a server that forgot the adapter can load it again


def upstream_urls(project: Project) -> list[str]:
    """The project's model servers (ProjectSettings.model_servers)."""
    return settings_for(project).model_servers(project)


class UpstreamHealth:
    """Which model servers this process saw fail lately. A failed server is skipped for
    GATEWAY_UPSTREAM_COOLDOWN_SECONDS, then gets calls again; an answer clears its record."""

    def __init__(self) -> None:
        self._retry_at: dict[str, float] = {}
        self._turn = itertools.count()

    def order(self, urls: Sequence[str]) -> list[str]:
        """The servers to try, in order: the healthy ones taking turns, then those cooling
        down, soonest back first (a call still goes somewhere when every server failed)."""
        now = time.monotonic()
        healthy = [url for url in urls if self._retry_at.get(url, 0.0) <= now]
        cooling = sorted(set(urls) - set(healthy), key=lambda url: self._retry_at[url])
        if healthy:
            start = next(self._turn) % len(healthy)
            healthy = healthy[start:] + healthy[:start]
        return healthy + cooling

    def failed(self, url: str) -> None:
        self._retry_at[url] = time.monotonic() + settings.GATEWAY_UPSTREAM_COOLDOWN_SECONDS

    def answered(self, url: str) -> None:
        self._retry_at.pop(url, None)


upstream_health = UpstreamHealth()


async def project_for_key(secret: str) -> GatewayProject | None:
    secret_hash = ApiKey.hash_secret(secret)
    now = time.monotonic()
    cached = key_cache.entries.get(secret_hash)
    if cached and cached[0] > now:
        return cached[1]
    try:
        project = await _read_project(secret_hash)
    except DatabaseError:
        if cached:  # the database is away: answer with what this process last knew
            logger.warning("routing from a stale cache: the database is unavailable")
            return cached[1]
        raise
    key_cache.entries[secret_hash] = (now + key_cache.CACHE_SECONDS, project)
    return project


@sync_to_async
def _read_project(secret_hash: str) -> GatewayProject | None:
    """The key's project and routing, read in one thread hop. The gateway's handler sends no
    request_started/finished (reviewapp/gateway/asgi.py): this is its only database work, so
    the connection check Django runs around a request (close_old_connections: drop a broken
    connection or one past CONN_MAX_AGE) runs here, unless a transaction is open on the
    connection (a test's)."""
    _check_connection()
    try:
        return _project_for_hash(secret_hash)
    finally:
        _check_connection()


def _check_connection() -> None:
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


def _project_for_hash(secret_hash: str) -> GatewayProject | None:
    key = (
        ApiKey.objects.select_related("project")
        .filter(secret_hash=secret_hash, revoked_at__isnull=True)
        .first()
    )
    if key is None:
        return None
    p = key.project
    route = ModelRoute.objects.filter(project=p).first()
    adapters = dict(Adapter.objects.filter(project=p).values_list("name", "path"))
    return GatewayProject(
        id=p.pk,
        slug=p.slug,
        served_model=p.served_model,
        upstream_urls=tuple(upstream_urls(p)),
        base_upstream_model=p.upstream_model or p.served_model,
        primary=route.primary if route else "",
        canary=route.canary if route else "",
        canary_share=route.canary_share if route else 0,
        base_model=p.base_model,
        adapters=adapters,
        key_scopes=frozenset(key.scopes),
    )


def forget_cached_routes() -> None:
    """Called after a route changes in this process; other processes catch up within seconds."""
    key_cache.forget_all()


def destination_for(
    project: GatewayProject, requested_model: str, rng: random.Random | None = None
) -> Destination | None:
    """The alias goes to the primary route, or to the canary for its share; the base model's
    names go to the base and the project's own adapters by name. Any other name is None: a
    shared model server also serves other projects' adapters, which this key may not call."""
    # The alias first: by default it is also the base model's name, and it must follow the route.
    if requested_model != project.served_model:
        if requested_model in project.adapters:
            return _to_adapter(project, requested_model)
        if requested_model in (project.base_upstream_model, project.base_model):
            return Destination(project.upstream_urls, project.base_upstream_model, "")
        return None
    target = project.primary
    share = project.canary_share if project.canary else 0
    if share and (rng or random).random() * 100 < share:
        target = project.canary
    if not target:
        return Destination(project.upstream_urls, project.base_upstream_model, "")
    return _to_adapter(project, target)


def _to_adapter(project: GatewayProject, name: str) -> Destination:
    return Destination(project.upstream_urls, name, name, project.adapters.get(name, ""))
