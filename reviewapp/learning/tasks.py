"""Celery tasks of the learning loop: ids in, claim, call the service, record the outcome.

Training is never retried silently: a failure ends the run in `failed` with the reason, where a
person sees it. A redelivered run whose worker died is taken over and resumes from its last
checkpoint (runs.claim). A worker that starts sends again what a crash left behind.
"""

import logging

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import connections

from reviewapp import jobs
from reviewapp.learning.models import RunStatus, TrainingRun
from reviewapp.learning.proposals import propose_targets_for
from reviewapp.learning.retrain import execute_run
from reviewapp.learning.runs import claim, resend_lost_work

logger = logging.getLogger(__name__)

# A redelivery that finds its run still reporting (the broker presumed a slow worker dead, or the
# worker died moments ago) looks again this many times, a heartbeat timeout apart.
LIVE_RUN_RECHECKS = 3


@shared_task(name=jobs.PROPOSE_TARGETS, acks_late=True)
def propose_targets_for_feedback(feedback_id: int) -> int:
    """Targets for one feedback: its correction as is, else the teacher's revisions."""
    return propose_targets_for(feedback_id=feedback_id)


@shared_task(name=jobs.RUN_TRAINING, acks_late=True, bind=True)  # queue `gpu`: its route
def run_training(self, run_id: int) -> str:
    """Build the data, train the adapter, evaluate it, gate it, deploy it."""
    run = claim(run_id)
    if run is not None:
        return execute_run(run)
    live = TrainingRun.objects.filter(
        pk=run_id, status__in=(RunStatus.BUILDING, RunStatus.TRAINING)
    ).exists()
    if live and self.request.retries < LIVE_RUN_RECHECKS:
        # Its worker may be dead with a heartbeat not yet stale: look again once it would be.
        raise self.retry(countdown=settings.TRAINING_HEARTBEAT_TIMEOUT_SECONDS)
    return "not claimed"  # cancelled, finished, or delivered a second time


@worker_ready.connect
def resend_lost_work_when_ready(**_) -> None:
    """A (re)started worker picks up what a crash or a broker outage left behind."""
    try:
        logger.info("recovered on start: %s", resend_lost_work())
    except Exception:  # a worker that cannot recover old work can still do new work
        logger.exception("could not look for lost work")
    finally:
        connections.close_all()  # the pool's processes have their own
