"""Celery tasks of the review side (queue `default`): triage and embeddings after ingest, and
once a recorded episode goes quiet.

Each takes ids and is idempotent: a rule looks at a trace once, and a trace whose compact
text has not changed is not embedded again, so a second delivery does nothing.
"""

from celery import shared_task
from django.conf import settings
from django.db import transaction

from reviewapp.models import TriageRule
from reviewapp.services import similarity, triage


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


@shared_task(name="reviewapp.settle_trace", bind=True, acks_late=True)
def settle_trace(self, trace_id: int) -> bool:
    """A gateway trace quiet for GATEWAY_QUIET_SECONDS: pack its body, triage and embed it.
    Not quiet yet: look again when it could be. Returns whether it settled."""
    from reviewapp.services.calls import settle_trace as settle  # calls imports this module

    wait = settle(trace_id=trace_id, force=bool(self.request.is_eager))
    if wait is None:
        return True
    settle_trace.apply_async((trace_id,), countdown=wait)
    return False


def settle_when_quiet(trace_ids: list[int]) -> None:
    """Settle recorded traces once they go quiet (the recorder asks once per quiet period)."""
    for trace_id in trace_ids:
        transaction.on_commit(
            lambda trace_id=trace_id: settle_trace.apply_async(
                (trace_id,), countdown=settings.GATEWAY_QUIET_SECONDS
            )
        )
