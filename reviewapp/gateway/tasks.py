"""Celery tasks of the gateway (queue `default`): settling a recorded episode once it goes quiet.

Settling packs the trace's segments into its body, then triage and embedding run once
(gateway/calls.settle_traces). A second delivery finds the trace settled and does nothing.
"""

import math

from celery import shared_task

from reviewapp import jobs
from reviewapp.gateway.calls import settle_traces as settle


@shared_task(name=jobs.SETTLE_TRACES, bind=True, acks_late=True)
def settle_traces(self, trace_ids: list[int]) -> int:
    """Gateway traces quiet for GATEWAY_QUIET_SECONDS: pack their bodies, triage and embed them.
    Those not quiet yet are looked at again when they could be. Returns how many settled (or
    were gone)."""
    return _settle_or_wait(trace_ids, force=bool(self.request.is_eager))


# Not sent any more: tasks the recorder once asked for, one trace each, may still be queued.
@shared_task(name="reviewapp.settle_trace", bind=True, acks_late=True)
def settle_trace(self, trace_id: int) -> bool:
    """One trace. Returns whether it settled."""
    return _settle_or_wait([trace_id], force=bool(self.request.is_eager)) == 1


def _settle_or_wait(trace_ids: list[int], *, force: bool) -> int:
    """Settle the quiet ones; the others wait in one task per whole second still to wait (a
    trace is looked at again up to a second late, never early)."""
    waits = settle(trace_ids=trace_ids, force=force)
    later: dict[int, list[int]] = {}
    for trace_id, wait in waits.items():
        later.setdefault(math.ceil(wait), []).append(trace_id)
    for seconds, ids in sorted(later.items()):
        jobs.enqueue(jobs.SETTLE_TRACES, ids, countdown=seconds)
    return len(trace_ids) - len(waits)
