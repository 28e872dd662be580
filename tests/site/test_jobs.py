"""A job enqueued by name (reviewapp/jobs.py) is a message on the broker that the worker's task
of that name, consuming that queue, receives."""

import time

import kombu
import pytest

from reviewapp import jobs
from reviewapp.celery import app

# Where each job must land: training on the GPU workers' queue, everything else on `default`.
QUEUE_OF = {
    jobs.PROPOSE_TARGETS: "default",
    jobs.RUN_TRAINING: "gpu",
    jobs.TRIAGE_TRACES: "default",
    jobs.RUN_TRIAGE_RULE: "default",
    jobs.EMBED_TRACES: "default",
    jobs.SETTLE_TRACES: "default",
}
# Ids no row has: a worker that got one of these messages would find nothing to do.
NO_ROW = 10**12
ARGS_OF = {
    jobs.PROPOSE_TARGETS: (NO_ROW,),
    jobs.RUN_TRAINING: (NO_ROW,),
    jobs.TRIAGE_TRACES: ([NO_ROW],),
    jobs.RUN_TRIAGE_RULE: (NO_ROW,),
    jobs.EMBED_TRACES: ([NO_ROW],),
    jobs.SETTLE_TRACES: ([NO_ROW],),
}


def received(queue_name: str, task_name: str, args: tuple) -> kombu.Message:
    """Take the message of that task with those arguments off the queue a worker consumes by
    that name, waiting for it a little. Other messages found there are put back."""
    others = []
    with app.connection_for_read() as connection:
        queue = app.amqp.queues[queue_name](connection.default_channel)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                message = queue.get()
                if message is None:
                    time.sleep(0.05)
                    continue
                sent_args, _, _ = message.decode()
                if message.headers["task"] == task_name and tuple(sent_args) == args:
                    message.ack()
                    return message
                others.append(message)
        finally:
            for message in others:
                message.requeue()
    raise AssertionError(f"no {task_name}{args} on queue {queue_name}")


def test_every_job_has_a_queue_here():
    names = {value for name, value in vars(jobs).items() if name.isupper()}
    assert names == set(QUEUE_OF) == set(ARGS_OF)


@pytest.mark.parametrize("task_name", sorted(QUEUE_OF))
def test_a_job_sent_by_name_reaches_its_task_on_its_queue(task_name):
    jobs.enqueue(task_name, *ARGS_OF[task_name])

    message = received(QUEUE_OF[task_name], task_name, ARGS_OF[task_name])
    assert message.headers["eta"] is None
    app.loader.import_default_modules()  # what a worker does on start: import the task modules
    assert task_name in app.tasks


def test_a_job_with_a_countdown_carries_when_to_run():
    jobs.enqueue(jobs.SETTLE_TRACES, [NO_ROW], countdown=30)

    message = received("default", jobs.SETTLE_TRACES, ([NO_ROW],))
    assert message.headers["eta"] is not None
