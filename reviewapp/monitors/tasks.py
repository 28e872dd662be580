"""Celery tasks of the monitors (queue `default`): triage and embeddings after ingest, a triage
rule's "run now".

Each takes ids and is idempotent: a rule looks at a trace once, and a trace whose compact
text has not changed is not embedded again, so a second delivery does nothing.
"""

from celery import shared_task

from reviewapp import jobs
from reviewapp.monitors import similarity, triage
from reviewapp.monitors.models import TriageRule


@shared_task(name=jobs.TRIAGE_TRACES, acks_late=True)
def triage_traces(trace_ids: list[int]) -> int:
    """Route traces that arrived or changed through their projects' enabled rules."""
    return triage.triage_new_traces(trace_ids=trace_ids)


@shared_task(name=jobs.RUN_TRIAGE_RULE, acks_late=True)
def run_triage_rule(rule_id: int) -> int:
    """A rule's "run now": every stored trace of its project it has not looked at yet."""
    rule = TriageRule.objects.select_related("project", "queue").filter(pk=rule_id).first()
    if rule is None or not rule.enabled:
        return 0
    return triage.route_traces(rule=rule).routed


@shared_task(name=jobs.EMBED_TRACES, acks_late=True)
def embed_traces(trace_ids: list[int]) -> int:
    """Embed traces with the bundled sentence model (loaded once per worker process)."""
    return similarity.embed_traces(trace_ids=trace_ids)
