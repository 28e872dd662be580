"""The Celery app. Queues: `default` (ingest post-processing, targets, evals), `gpu` (training).

Tasks are routed to their queue by name (settings.CELERY_TASK_ROUTES), so the web process sends
them through reviewapp.jobs without importing any task module.
"""

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reviewapp.settings")

app = Celery("apprentice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["reviewapp.learning", "reviewapp.monitors", "reviewapp.gateway"])

# The embedded file-system broker expects its folders to exist.
for option in ("data_folder_in", "processed_folder", "control_folder"):
    folder = app.conf.broker_transport_options.get(option)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
