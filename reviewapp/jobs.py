"""Starting background work: every service and view enqueues a Celery task here, by its name.

Services never import a task module (the task modules import the services), so nothing here
needs the task functions: a task is sent by the `name=` its decorator gives it, and
settings.CELERY_TASK_ROUTES sends it to its queue (`gpu` for training, `default` for the rest).
"""

from functools import partial

from django.conf import settings
from django.db import transaction

from reviewapp.celery import app

# The tasks' names: the task modules register each under the same constant.
PROPOSE_TARGETS = "training.propose_targets"
RUN_TRAINING = "training.run_training"
TRIAGE_TRACES = "reviewapp.triage_traces"
RUN_TRIAGE_RULE = "reviewapp.run_triage_rule"
EMBED_TRACES = "reviewapp.embed_traces"
SETTLE_TRACES = "reviewapp.settle_traces"


def enqueue(task_name: str, *args, countdown: float | None = None) -> None:
    """Send a task now, to run as soon as a worker is free or `countdown` seconds from now.
    Work about rows the caller's transaction is writing goes through enqueue_on_commit."""
    app.send_task(task_name, args=args, countdown=countdown)


def enqueue_on_commit(task_name: str, *args) -> None:
    """Send a task once the current transaction commits (at once outside a transaction), so
    the worker finds the rows it is about and a rolled-back request sends nothing."""
    transaction.on_commit(partial(enqueue, task_name, *args))


def after_traces_changed(trace_ids: list[int]) -> None:
    """Triage and embed traces once the transaction that stored them commits."""
    if trace_ids:
        enqueue_on_commit(TRIAGE_TRACES, trace_ids)
        enqueue_on_commit(EMBED_TRACES, trace_ids)


def settle_when_quiet(trace_ids: list[int]) -> None:
    """Ask one task to settle recorded traces once they have gone quiet (the recorder asks
    once per quiet period per trace, after the calls are committed)."""
    if trace_ids:
        enqueue(SETTLE_TRACES, trace_ids, countdown=settings.GATEWAY_QUIET_SECONDS)
