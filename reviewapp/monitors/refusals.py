"""Requests the gateway refuses before the model sees them: counted, never stored as traces.

A wrong key, a model the project does not serve or a body no model server would take says
something about the harness's set-up, not about the agent's work; as traces they crowded the
list and said nothing. Each refusal adds one to an in-process tally (no database on the request
path, so a flood of bad keys costs no writes per request); a thread adds the tally to
`GatewayRefusal` rows every few seconds. A process killed between two flushes loses those
seconds' counts.
"""

import contextlib
import logging
import threading
import time
from collections import Counter
from datetime import datetime, timedelta

from django.db import DatabaseError, IntegrityError, connection
from django.db.models import F, Sum
from django.utils import timezone

from reviewapp.monitors.models import GatewayRefusal, RefusalReason
from reviewapp.projects.models import Project

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0


def add_refusals(*, project_id: int | None, reason: str, hour: datetime, count: int) -> None:
    """Add to the hour's row for the project and reason, made when there is none yet."""
    rows = GatewayRefusal.objects.filter(project_id=project_id, reason=reason, hour=hour)
    if not rows.update(count=F("count") + count):
        GatewayRefusal.objects.create(project_id=project_id, reason=reason, hour=hour, count=count)


class RefusalCounter:
    """One per process: counts in memory, written by its own thread every `flush_seconds`
    (None: no thread, whoever holds it calls `flush`, as tests do)."""

    def __init__(self, *, flush_seconds: float | None = FLUSH_SECONDS) -> None:
        self.flush_seconds = flush_seconds
        # (project id, reason, hour) -> requests refused
        self._tally: Counter[tuple[int | None, str, datetime]] = Counter()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def count(self, *, project_id: int | None, reason: RefusalReason) -> None:
        hour = timezone.now().replace(minute=0, second=0, microsecond=0)
        with self._lock:
            self._tally[(project_id, reason.value, hour)] += 1
            if self.flush_seconds is not None and (
                self._thread is None or not self._thread.is_alive()
            ):
                self._thread = threading.Thread(
                    target=self._run, name="gateway-refusals", daemon=True
                )
                self._thread.start()

    def flush(self) -> None:
        """Write what was counted since the last flush; what could not be written (the
        database is away) is kept for the next one."""
        with self._lock:
            pending, self._tally = list(self._tally.items()), Counter()
        try:
            while pending:
                (project_id, reason, hour), count = pending[-1]
                # IntegrityError: the project was deleted meanwhile, nobody to show them to
                with contextlib.suppress(IntegrityError):
                    add_refusals(project_id=project_id, reason=reason, hour=hour, count=count)
                pending.pop()
        except Exception:
            with self._lock:
                self._tally.update(dict(pending))
            raise

    def _run(self) -> None:
        while True:
            time.sleep(self.flush_seconds)
            try:
                self.flush()
            except DatabaseError as error:
                logger.warning("counting refused gateway requests failed: %s", error)
            except Exception:
                logger.exception("counting refused gateway requests failed")
            finally:
                connection.close()  # hold no database connection between flushes


refusals = RefusalCounter()


def recent_refusals(project: Project, *, hours: int = 24) -> dict[str, int]:
    """The project's refused requests per reason in the last `hours` (this one included), most
    first."""
    since = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    counts = (
        GatewayRefusal.objects.filter(project=project, hour__gte=since)
        .values("reason")
        .annotate(total=Sum("count"))
        .order_by("-total", "reason")
    )
    return {row["reason"]: row["total"] for row in counts}
