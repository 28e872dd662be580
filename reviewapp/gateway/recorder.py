"""Recording off the request path: the harness has its answer before anything is written.

Calls go onto an in-process queue; one thread per process writes them, the calls queued
meanwhile in one transaction (up to MAX_BATCH). A slow or briefly unavailable database delays
recording, never the harness. A process killed with calls still queued loses those records (the
harness got its answers); see docs/reliability.md.
"""

import itertools
import logging
import queue
import threading
import time

from django.db import InterfaceError, OperationalError, connection

from reviewapp.services.calls import RecordedCall, record_model_calls

logger = logging.getLogger(__name__)

MAX_QUEUED_CALLS = 10_000
# Calls written per transaction: one commit (and one INSERT per table) for a burst of calls.
MAX_BATCH = 200
# How long one record waits for an unavailable database (a restart, a failover) before it is
# dropped; the calls behind it wait in the queue meanwhile.
WRITE_RETRY_SECONDS = 60.0


class CallRecorder:
    def __init__(self) -> None:
        self._queue: queue.Queue[RecordedCall] = queue.Queue(maxsize=MAX_QUEUED_CALLS)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def submit(self, call: RecordedCall) -> None:
        self._ensure_thread()
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            self.dropped += 1
            logger.error("recording queue full; dropped a call record (%d so far)", self.dropped)

    def wait_until_idle(self, timeout: float = 10.0) -> bool:
        """Block until every submitted call is written (tests and shutdown use this)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="gateway-recorder", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(batch)
            finally:
                if self._queue.empty():
                    connection.close()  # idle: hold no database connection
                for _ in batch:
                    self._queue.task_done()

    def _write(self, batch: list[RecordedCall]) -> None:
        """The batch in one transaction; if one call in it cannot be stored, the others still
        are, one by one."""
        try:
            self._with_retries(record_model_calls, batch)
        except Exception:  # not transient (a project was deleted, say)
            if len(batch) == 1:
                logger.exception("recording a call failed; dropping it")
                return
            for call in batch:
                self._write([call])

    def _with_retries(self, write, batch: list[RecordedCall]) -> None:
        deadline = time.monotonic() + WRITE_RETRY_SECONDS
        for attempt in itertools.count(1):
            try:
                # One connection kept while there is work: a fresh connection per record cost
                # ~2 ms of CPU and capped recording at ~50 calls/s.
                write(batch)
                return
            except (OperationalError, InterfaceError):  # the database is away: wait
                connection.close()
                if time.monotonic() > deadline:
                    self.dropped += len(batch)
                    logger.error("database away too long; dropped %d call records", len(batch))
                    return
                logger.warning("recording calls failed (attempt %d)", attempt)
                time.sleep(min(2**attempt * 0.1, 5))


recorder = CallRecorder()
