"""Recording off the request path: the harness has its answer before anything is written.

Calls go onto an in-process queue; one thread per process writes them in batches: a call, the
calls that follow it within BATCH_WAIT_SECONDS and those queued meanwhile, in one transaction
(up to MAX_BATCH). The traces those batches ask to settle are published together, one task at
most every SETTLE_PUBLISH_SECONDS. A slow or briefly unavailable database delays recording,
never the harness. A process killed with calls still queued loses those records (the harness
got its answers), and the settle tasks not yet published (the next call of such a trace after
its grace period asks again); see docs/reliability.md.
"""

import itertools
import logging
import queue
import threading
import time

from django.db import InterfaceError, OperationalError, connection

from reviewapp.gateway.calls import RecordedCall, record_model_calls
from reviewapp.jobs import settle_when_quiet

logger = logging.getLogger(__name__)

MAX_QUEUED_CALLS = 10_000
# Calls written per transaction: one commit (and one INSERT per table) for a burst of calls.
MAX_BATCH = 200
# How long a batch waits for more calls after its first. A transaction and its INSERTs cost
# about as much CPU for 20 calls as for one; waiting this long makes a steady stream of calls
# into batches, at the price of recording each call up to this much later (the harness has its
# answer before; see bench/README.md, gateway.py).
BATCH_WAIT_SECONDS = 0.05
# How long the traces to settle are collected before one task is published for them all:
# publishing a task costs about 1 ms of CPU, as much as writing several calls.
SETTLE_PUBLISH_SECONDS = 1.0
# How long the writer keeps its database connection with nothing to write: a connection costs
# ~2 ms of CPU to open, so one closed whenever the queue ran dry was reopened for almost every
# batch of a steady trickle of calls.
IDLE_CLOSE_SECONDS = 5.0
# How long one record waits for an unavailable database (a restart, a failover) before it is
# dropped; the calls behind it wait in the queue meanwhile.
WRITE_RETRY_SECONDS = 60.0


class CallRecorder:
    def __init__(self) -> None:
        self._queue: queue.Queue[RecordedCall] = queue.Queue(maxsize=MAX_QUEUED_CALLS)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0
        # The writer thread's own: traces committed batches asked to settle, and when to ask.
        self._to_settle: set[int] = set()
        self._settle_at = 0.0

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
            batch = [self._next_call()]
            deadline = time.monotonic() + BATCH_WAIT_SECONDS
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            try:
                self._write(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if self._to_settle and time.monotonic() >= self._settle_at:
                self._publish_settles()

    def _next_call(self) -> RecordedCall:
        """The next call to write; while waiting for it, publish the settles when they are due
        and, idle long enough, let the database connection go."""
        idle_until = time.monotonic() + IDLE_CLOSE_SECONDS
        while True:
            wake = min(self._settle_at, idle_until) if self._to_settle else idle_until
            try:
                return self._queue.get(timeout=max(0.0, wake - time.monotonic()))
            except queue.Empty:
                pass
            if self._to_settle and time.monotonic() >= self._settle_at:
                self._publish_settles()
            elif time.monotonic() >= idle_until:
                connection.close()  # idle: hold no database connection
                return self._queue.get()

    def _settle_later(self, trace_ids: list[int]) -> None:
        """A committed batch's traces to settle: published with the others due meanwhile."""
        if not self._to_settle:
            self._settle_at = time.monotonic() + SETTLE_PUBLISH_SECONDS
        self._to_settle.update(trace_ids)

    def _publish_settles(self) -> None:
        try:
            settle_when_quiet(sorted(self._to_settle))
        except Exception:  # the broker is away: keep them for the next try
            logger.exception("asking to settle %d traces failed", len(self._to_settle))
            self._settle_at = time.monotonic() + SETTLE_PUBLISH_SECONDS
            return
        self._to_settle.clear()

    def _write(self, batch: list[RecordedCall]) -> None:
        """The batch in one transaction; if one call in it cannot be stored, the others still
        are, one by one."""
        try:
            self._with_retries(self._record, batch)
        except Exception:  # not transient (a project was deleted, say)
            if len(batch) == 1:
                logger.exception("recording a call failed; dropping it")
                return
            for call in batch:
                self._write([call])

    def _record(self, batch: list[RecordedCall]) -> None:
        record_model_calls(batch, ask_settle=self._settle_later)

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
