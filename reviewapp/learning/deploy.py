"""Putting an adapter in front of the harness and taking it away: the route's state machine.

A project's ModelRoute changes only here, each change under the row's lock:

    deploy, share 100     the adapter answers every call; the old primary is what rollback restores
    deploy, share 1-99    the adapter is the canary for that share of calls
    set_canary_share      the canary's share changes
    promote_canary        the canary answers every call; the old primary is what rollback restores
    rollback(adapter)     that adapter's canary is dropped, or as primary it hands back

A refused change raises DeployRefused and changes nothing. Loading on the model servers takes
seconds, so it happens before the lock; a deploy whose route moved meanwhile is refused rather
than overwriting that move. Each server's outcome is kept on the adapter (eval_results["deploy"]);
the route moves once `deploy_quorum` servers (the project's, else DEPLOY_QUORUM; default: all)
loaded the adapter and answered with it. A run's deploy uses the servers and quorum frozen on the
run (learning/plan.py); a person's deploy from the adapter page, the project's settings now.
"""

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import httpx
from django.db import transaction
from django.utils import timezone

from reviewapp.learning.lineage import adapter_report
from reviewapp.learning.models import Adapter, ModelRoute
from reviewapp.learning.plan import RunPlan
from reviewapp.projects import key_cache
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import settings_for
from training.deploy import DeployError, canary_request, load_adapter, unload_adapter

logger = logging.getLogger(__name__)


class DeployRefused(DeployError):
    """The route or the adapter does not allow this change now; nothing was changed."""


@dataclass(frozen=True)
class Deployment:
    """Where one adapter stands on its project's route."""

    state: Literal["serving", "canary", "idle"]
    share: int  # percent of the alias's calls it answers
    restored_by_rollback: bool = False  # idle, but rolling back the primary brings it back

    @property
    def label(self) -> str:
        """The dashboard's word for the state."""
        if self.state == "serving":
            return "primary"
        if self.state == "canary":
            return "canary"
        return "previous primary" if self.restored_by_rollback else "not serving"


def deployment_of(adapter: Adapter, route: ModelRoute | None) -> Deployment:
    if route is None:
        return Deployment("idle", 0)
    if route.primary == adapter.name:
        return Deployment("serving", 100 - (route.canary_share if route.canary else 0))
    if route.canary == adapter.name:
        return Deployment("canary", route.canary_share)
    return Deployment("idle", 0, restored_by_rollback=route.previous_primary == adapter.name)


@contextmanager
def _locked_route(project: Project) -> Iterator[ModelRoute]:
    """The route row, locked; saved as the block leaves it unless the block raised."""
    with transaction.atomic():
        route, _ = ModelRoute.objects.select_for_update().get_or_create(project=project)
        yield route
        route.revision += 1
        route.updated_at = timezone.now()
        route.save()
        transaction.on_commit(key_cache.forget_all)


def _refuse_deploy(adapter: Adapter, route: ModelRoute | None) -> None:
    gate = adapter_report(adapter).get("gate") or {}
    if gate.get("passed") is False:
        reason = gate.get("reason", "")
        raise DeployRefused(f"The evaluation gate refused {adapter.name}: {reason}")
    if deployment_of(adapter, route).state == "serving":
        raise DeployRefused(f"{adapter.name} already answers the alias.")


def _make_primary(route: ModelRoute, name: str) -> None:
    route.previous_primary = route.primary
    route.primary, route.canary, route.canary_share = name, "", 0


def deploy_adapter(
    *,
    adapter: Adapter,
    share: int = 100,
    client: httpx.Client | None = None,
    before_route_change: Callable[[], None] | None = None,
    plan: RunPlan | None = None,
):
    """Load on every model server, send a canary request, then route `share`% of the alias to it.

    The servers and quorum are the run's `plan`'s (those the operator still allows); without
    one, the project's settings now (a person deploying an adapter they chose).

    Raises DeployRefused when the adapter may not serve or the route moved while it loaded,
    DeployError when a model server did not take it; either way routing is unchanged.
    `before_route_change` runs under the route's lock, in the transaction that changes it: what
    it raises leaves the route as it was (the worker moves its run to deployed there, so a
    cancel is either in time to stop the route changing or finds the run deployed).
    """
    if not 0 < share <= 100:
        raise ValueError("share must be between 1 and 100")
    project = adapter.project
    seen = ModelRoute.objects.filter(project=project).first()
    _refuse_deploy(adapter, seen)  # before loading: a refused adapter never reaches a server
    plan = plan or RunPlan.from_settings(project=project, project_settings=settings_for(project))
    urls = plan.model_servers(project)
    if not urls:
        raise DeployError(
            f"none of the model servers {', '.join(plan.upstreams)} is still one this deployment "
            "allows (MODEL_SERVERS)"
        )
    client = client or httpx.Client(timeout=60)
    servers = [_load_on(client, url, adapter) for url in urls]
    _record_deploy(adapter, servers)
    loaded = sum(server["loaded"] for server in servers)
    quorum = min(plan.deploy_quorum or len(servers), len(servers))
    if loaded < quorum:
        errors = "; ".join(server["error"] for server in servers if not server["loaded"])
        raise DeployError(
            f"{loaded} of {len(servers)} model servers serve {adapter.name}, {quorum} needed: "
            f"{errors}"
        )
    with _locked_route(project) as route:
        if route.revision != (seen.revision if seen else 0):
            raise DeployRefused(
                f"The route changed while {adapter.name} was loading; look again, then deploy."
            )
        _refuse_deploy(adapter, route)
        if before_route_change is not None:
            before_route_change()
        if share == 100:
            _make_primary(route, adapter.name)
        else:
            route.canary, route.canary_share = adapter.name, share


def _load_on(client: httpx.Client, url: str, adapter: Adapter) -> dict:
    """Load the adapter on one model server and prove it answers; the outcome, never raises."""
    try:
        load_adapter(client, url, name=adapter.name, path=adapter.path)
        canary_request(client, url, model=adapter.name)
    except DeployError as error:
        return {"url": url, "loaded": False, "error": str(error)[:500]}
    return {"url": url, "loaded": True, "error": ""}


def unload_everywhere(*, adapter: Adapter, client: httpx.Client | None = None) -> None:
    """Drop an adapter that no route names from the model servers its deploy loaded it on (a
    deploy withdrawn before routing). A server that does not answer is logged: the adapter
    there answers only calls that name it, and no route does."""
    servers = (adapter.eval_results or {}).get("deploy", {}).get("servers", [])
    client = client or httpx.Client(timeout=60)
    for server in servers:
        if not server["loaded"]:
            continue
        try:
            unload_adapter(client, server["url"], name=adapter.name)
        except (DeployError, httpx.HTTPError) as error:
            logger.warning("%s stays loaded on %s: %s", adapter.name, server["url"], error)
            continue
        server.update(loaded=False, error="unloaded: the deploy was withdrawn before routing")
    _record_deploy(adapter, servers)


def _record_deploy(adapter: Adapter, servers: list[dict]) -> None:
    with transaction.atomic():
        locked = Adapter.objects.select_for_update().get(pk=adapter.pk)
        deploy = {"at": timezone.now().isoformat(), "servers": servers}
        locked.eval_results = {**(locked.eval_results or {}), "deploy": deploy}
        locked.save(update_fields=["eval_results"])
    adapter.eval_results = locked.eval_results


def _refuse_unless_canary(adapter: Adapter, route: ModelRoute, action: str) -> None:
    if not route.canary:
        raise DeployRefused(f"There is no canary to {action}.")
    if route.canary != adapter.name:
        raise DeployRefused(f"{adapter.name} is not the canary ({route.canary} is).")


def promote_canary(*, adapter: Adapter) -> None:
    """The canary `adapter` answers every call."""
    with _locked_route(adapter.project) as route:
        _refuse_unless_canary(adapter, route, "promote")
        _make_primary(route, adapter.name)


def set_canary_share(*, adapter: Adapter, share: int) -> None:
    """Send `share`% of the alias to the canary `adapter`."""
    if not 0 < share < 100:
        raise ValueError("a canary share is between 1 and 99 percent")
    with _locked_route(adapter.project) as route:
        _refuse_unless_canary(adapter, route, "change the share of")
        route.canary_share = share


def rollback(*, adapter: Adapter) -> None:
    """Take `adapter` off the route: as the canary it is dropped; as the primary it hands the
    alias back to the previous primary (or the base). Refused when it serves no traffic, so a
    stale page cannot roll back someone else's deploy."""
    with _locked_route(adapter.project) as route:
        if route.canary == adapter.name:
            route.canary, route.canary_share = "", 0
        elif route.primary != adapter.name:
            raise DeployRefused(f"{adapter.name} is not serving traffic.")
        elif route.canary:
            raise DeployRefused(f"Promote or roll back the canary {route.canary} first.")
        else:
            route.primary, route.previous_primary = route.previous_primary, ""
