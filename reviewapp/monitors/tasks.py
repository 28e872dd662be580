"""Celery tasks of the review side (queue `default`): triage and embeddings after ingest, and
once a recorded episode goes quiet.

Each takes ids and is idempotent: a rule looks at a trace once, and a trace whose compact
text has not changed is not embedded again, so a second delivery does nothing.
"""

import math

from celery import shared_task
from django.conf import settings

from reviewapp.monitors import similarity, triage
from reviewapp.monitors.models import TriageRule


@shared_task(name="reviewapp.triage_traces", acks_late=True)
def triage_traces(trace_ids: list[int]) -> int:
    """Route traces that arrived or changed through their projects' enabled rules."""
    return triage.triage_new_traces(trace_ids=trace_ids)


@shared_task(name="reviewapp.run_triage_rule", acks_late=True)
def run_triage_rule(rule_id: int) -> int:
    """A rule's "run now": every stored trace of its project it has not looked at yet."""
    rule = TriageRule.objects.select_related("project", "queue").filter(pk=rule_id).first()
    if rule is None or not rule.enabled:
        return 0
    return triage.route_traces(rule=rule).routed


@shared_task(name="reviewapp.embed_traces", acks_late=True)
def embed_traces(trace_ids: list[int]) -> int:
    """Embed traces with the bundled sentence model (loaded once per worker process)."""
    return similarity.embed_traces(trace_ids=trace_ids)


def after_traces_changed(trace_ids: list[int]) -> None:
    """Triage and embed traces once the transaction that stored them commits."""
    if trace_ids:
        triage_traces.delay_on_commit(trace_ids)
        embed_traces.delay_on_commit(trace_ids)


@shared_task(name="reviewapp.settle_traces", bind=True, acks_late=True)
def settle_traces(self, trace_ids: list[int]) -> int:
    """Gateway traces quiet for GATEWAY_QUIET_SECONDS: pack their bodies, triage and embed them.
    Those not quiet yet are looked at again when they could be. Returns how many settled (or
    were gone)."""
    return _settle_or_wait(trace_ids, force=bool(self.request.is_eager))


@shared_task(name="reviewapp.settle_trace", bind=True, acks_late=True)
def settle_trace(self, trace_id: int) -> bool:
    """One trace (tasks the recorder asked for one trace each may still be queued). Returns
    whether it settled."""
    return _settle_or_wait([trace_id], force=bool(self.request.is_eager)) == 1


def _settle_or_wait(trace_ids: list[int], *, force: bool) -> int:
    """Settle the quiet ones; the others wait in one task per whole second still to wait (a
    trace is looked at again up to a second late, never early)."""
    from reviewapp.gateway.calls import settle_traces as settle  # calls imports this module

    waits = settle(trace_ids=trace_ids, force=force)
    later: dict[int, list[int]] = {}
    for trace_id, wait in waits.items():
        later.setdefault(math.ceil(wait), []).append(trace_id)
    for seconds, ids in sorted(later.items()):
        settle_traces.apply_async((ids,), countdown=seconds)
    return len(trace_ids) - len(waits)


def settle_when_quiet(trace_ids: list[int]) -> None:
    """Ask one task to settle recorded traces once they have gone quiet (the recorder asks
    once per quiet period per trace, after the calls are committed)."""
    if trace_ids:
        settle_traces.apply_async((trace_ids,), countdown=settings.GATEWAY_QUIET_SECONDS)
