"""The Celery app. Queues: `default` (ingest post-processing, targets, evals), `gpu` (training)."""

import logging
import os
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready
from django.db import connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reviewapp.settings")

logger = logging.getLogger(__name__)

app = Celery("apprentice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["reviewapp.learning", "reviewapp.monitors"])

# The embedded file-system broker expects its folders to exist.
for option in ("data_folder_in", "processed_folder", "control_folder"):
    folder = app.conf.broker_transport_options.get(option)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)


@worker_ready.connect
def resend_lost_work_when_ready(**_) -> None:
    """A (re)started worker picks up what a crash or a broker outage left behind."""
    from reviewapp.learning.runs import resend_lost_work

    try:
        logger.info("recovered on start: %s", resend_lost_work())
    except Exception:  # a worker that cannot recover old work can still do new work
        logger.exception("could not look for lost work")
    finally:
        connections.close_all()  # the pool's processes have their own
