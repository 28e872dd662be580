"""The Celery app. Queues: `default` (ingest post-processing, targets, evals), `gpu` (training)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reviewapp.settings")

app = Celery("apprentice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["reviewapp", "training"])
