"""Celery workers SIGKILLed mid-task, and Redis restarted under a run: no task lost, no run left
running, no targets stored twice, no half-written adapter."""

import os
import re
import signal
import threading
import time

import httpx
import pytest
import redis

from tests.faults.clients import IngestLog, batch, send_until_acknowledged
from tests.faults.conftest import (
    CONVERSATION,
    approve_a_correction,
    finished_run,
    use_tiny_base,
    wait_for,
)

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT_S = 3


def _feedback_without_correction(web, headers) -> None:
    """Feedback the teacher (the upstream, answering after 3 s) has to revise the turn for."""
    api = f"{web.url}/api/v1/traces"
    trace = {
        "external_id": "t",
        "messages": [
            {"role": "user", "content": "what is the capital of france ?"},
            {"role": "assistant", "content": "rome"},
        ],
    }
    assert httpx.post(api, json={"traces": [trace]}, headers=headers).status_code == 207
    response = httpx.post(
        f"{api}/t/feedback", json={"text": "say paris", "turn": 1}, headers=headers
    )
    assert response.status_code == 201, response.text


def _slow_teacher(stack, delay_s: float = 0.0):
    upstream = stack.upstream("--chat-delay", str(delay_s))
    # "slow-model" answers after 3 s (plus the delay): the worker is mid-generation that long.
    stack.execute(
        "UPDATE reviewapp_project SET upstream_url = %s, served_model = 'slow-model'", upstream.url
    )
    return upstream


def _teacher_calls(upstream) -> int:
    return upstream.tail(100_000).count("POST /v1/chat/completions")


def test_worker_killed_mid_target_generation_redelivers_and_stores_targets_once(stack, headers):
    upstream = _slow_teacher(stack)
    web = stack.web()
    visibility = {"CELERY_VISIBILITY_TIMEOUT": "4"}
    worker = stack.worker(**visibility)
    _feedback_without_correction(web, headers)
    wait_for(lambda: _teacher_calls(upstream) == 1, timeout=60, what="the teacher to be asked")
    worker.kill()  # the whole worker, main process included: nobody acknowledges the task
    received = r"training\.propose_targets\[([0-9a-f-]+)\] received"
    (task_id,) = re.findall(received, worker.tail(100_000))

    restarted = stack.worker(**visibility)
    wait_for(
        lambda: stack.scalar("SELECT count(*) FROM reviewapp_distillationtarget"),
        timeout=60,
        what="the redelivered task to store its targets",
    )
    # The broker handed the unacknowledged task to the new worker once it was presumed dead.
    wait_for(
        lambda: f"[{task_id}] received" in restarted.tail(100_000), timeout=30, what="redelivery"
    )
    time.sleep(3)  # time for any further (wrong) delivery to land
    assert _teacher_calls(upstream) == 2
    assert stack.scalar("SELECT count(*) FROM reviewapp_distillationtarget") == 1
    assert stack.scalar("SELECT status FROM reviewapp_feedback") == "used"


def test_overlapping_deliveries_of_target_generation_store_targets_once(stack, headers):
    upstream = _slow_teacher(stack, delay_s=6)
    web = stack.web()
    # Shorter than the task: the broker presumes the first worker dead and hands the task to
    # the second while the first is still generating.
    visibility = {"CELERY_VISIBILITY_TIMEOUT": "2"}
    stack.worker(**visibility)
    stack.worker(**visibility)
    _feedback_without_correction(web, headers)
    wait_for(lambda: _teacher_calls(upstream) >= 2, timeout=60, what="a second delivery")
    wait_for(lambda: _finished_proposals(stack) >= 2, timeout=90, what="both deliveries to finish")
    assert stack.scalar("SELECT count(*) FROM reviewapp_distillationtarget") == 1


def _finished_proposals(stack) -> int:
    logs = "".join(process.tail(1_000_000) for process in stack.processes)
    return sum(
        1
        for line in logs.splitlines()
        if "training.propose_targets[" in line and "succeeded" in line
    )


def test_worker_killed_mid_training_resumes_the_run_from_its_checkpoint(
    stack, headers, make_tiny_llama, make_tiny_tokenizer
):
    # The most updates a config allows (10,000): far longer than the test, however fast the machine.
    use_tiny_base(stack, make_tiny_llama, make_tiny_tokenizer, min_steps=10_000, save_every_steps=5)
    stack.extra_environment["TRAINING_HEARTBEAT_TIMEOUT_SECONDS"] = str(HEARTBEAT_TIMEOUT_S)
    web = stack.web()
    worker = stack.worker()
    approve_a_correction(stack, web, headers)
    run_id = httpx.post(f"{web.url}/api/v1/runs", json={}, headers=headers).json()["id"]
    checkpoints = stack.root / "adapters" / ".checkpoints" / f"run-{run_id}"
    wait_for(
        lambda: checkpoints.is_dir() and len(list(checkpoints.glob("step-*"))) >= 2,
        timeout=120,
        what="training to be under way with checkpoints",
    )
    (pool_process,) = worker.children()
    os.kill(pool_process, signal.SIGKILL)  # what the out-of-memory killer does
    last_checkpoint = max(
        int(path.name.removeprefix("step-")) for path in checkpoints.glob("step-*")
    )

    # The main process requeues the task (reject on worker lost); the redelivery finds the run's
    # heartbeat still fresh, looks again once it is stale, takes the run over and resumes it.
    wait_for(
        lambda: (
            stack.scalar("SELECT attempts FROM reviewapp_trainingrun WHERE id = %s", run_id) == 2
        ),
        timeout=60,
        what="the redelivered task to take the run over",
    )
    assert "resumed after its worker stopped reporting" in worker.tail(1_000_000)
    # Its loss curve continues the dead worker's: it did not start again from step 1.
    [(resumed_steps,)] = wait_for(
        lambda: stack.query(
            "SELECT jsonb_array_length(loss_curve) FROM reviewapp_trainingrun WHERE id = %s "
            "AND status = 'training' AND attempts = 2 AND (progress->>'step')::int > %s",
            run_id,
            last_checkpoint,
        ),
        timeout=60,
        what="the resumed run to train past its checkpoint",
    )
    assert resumed_steps > last_checkpoint
    stack.execute("UPDATE reviewapp_trainingrun SET cancel_requested = true WHERE id = %s", run_id)
    run = wait_for(lambda: finished_run(web, headers, run_id), timeout=60, what="the cancel")
    assert run["status"] == "cancelled"
    assert stack.scalar("SELECT count(*) FROM reviewapp_adapter") == 0

    # The same worker trains the next run to the end, and no heartbeat gap fails it early.
    use_tiny_base(stack, make_tiny_llama, make_tiny_tokenizer, epochs=2)
    run_id = httpx.post(f"{web.url}/api/v1/runs", json={}, headers=headers).json()["id"]
    run = wait_for(lambda: finished_run(web, headers, run_id), timeout=120, what="the next run")
    assert run["status"] == "trained"


def test_redis_restarted_during_a_run_and_ingest_loses_nothing(
    stack, headers, make_tiny_llama, make_tiny_tokenizer
):
    # Long enough to be training through the whole restart, however fast the machine is.
    use_tiny_base(stack, make_tiny_llama, make_tiny_tokenizer, min_steps=10_000)
    web = stack.web()
    worker = stack.worker()
    approve_a_correction(stack, web, headers)
    run_id = httpx.post(f"{web.url}/api/v1/runs", json={}, headers=headers).json()["id"]
    wait_for(
        lambda: stack.scalar(
            "SELECT status FROM reviewapp_trainingrun WHERE id = %s", run_id
        ) == "training",
        timeout=120,
        what="training to start",
    )  # fmt: skip
    log = IngestLog()
    with httpx.Client(timeout=30) as client:
        send_until_acknowledged(client, web.url, headers, batch("before", 50), log)
        stack.redis.kill()
        restart = threading.Timer(2.0, stack.redis.start)
        restart.start()
        # Ingest enqueues triage and embedding: the publish retries bridge the restart.
        send_until_acknowledged(client, web.url, headers, batch("during", 50), log)
        restart.join()
        status_after_restart = stack.scalar(
            "SELECT status FROM reviewapp_trainingrun WHERE id = %s", run_id
        )
        send_until_acknowledged(client, web.url, headers, batch("after", 50), log)

    assert status_after_restart == "training"  # the restart hit a live run...
    stack.execute("UPDATE reviewapp_trainingrun SET cancel_requested = true WHERE id = %s", run_id)
    run = wait_for(lambda: finished_run(web, headers, run_id), timeout=60, what="the run")
    assert run["status"] == "cancelled"  # ...which kept going, and stopped when asked
    assert log.failures == [] and log.retries == 0
    assert set(log.acknowledged.values()) == {201}
    assert stack.scalar("SELECT count(*) FROM reviewapp_trace") == 1 + 150
    # The worker reconnected to the restarted broker: new feedback still becomes targets.
    feedback = {"text": "x", "turn": 4, "correction": {"role": "assistant", "content": "paris"}}
    response = httpx.post(
        f"{web.url}/api/v1/traces/before-0/feedback", json=feedback, headers=headers
    )
    assert response.status_code == 201, response.text
    wait_for(
        lambda: stack.scalar("SELECT count(*) FROM reviewapp_distillationtarget") == 2,
        timeout=60,
        what="the worker to take work after the restart",
    )
    assert worker.process.poll() is None


def test_a_starting_worker_resends_work_whose_messages_the_broker_lost(
    stack, headers, make_tiny_llama, make_tiny_tokenizer
):
    use_tiny_base(stack, make_tiny_llama, make_tiny_tokenizer)
    web = stack.web()
    # Enqueued while no worker runs, then lost: a broker restarted without its queues (or down
    # for longer than the publish retries).
    feedback = {"text": "x", "turn": 1, "correction": {"role": "assistant", "content": "paris"}}
    trace = {"external_id": "t", "messages": CONVERSATION}
    api = f"{web.url}/api/v1/traces"
    assert httpx.post(api, json={"traces": [trace]}, headers=headers).status_code == 207
    assert httpx.post(f"{api}/t/feedback", json=feedback, headers=headers).status_code == 201
    redis.Redis(port=stack.redis.port).flushall()

    worker = stack.worker()
    wait_for(
        lambda: stack.scalar("SELECT count(*) FROM reviewapp_distillationtarget") == 1,
        timeout=60,
        what="the resent proposal",
    )
    worker.kill()
    run_id = httpx.post(f"{web.url}/api/v1/runs", json={}, headers=headers).json()["id"]
    redis.Redis(port=stack.redis.port).flushall()
    stack.worker()
    run = wait_for(lambda: finished_run(web, headers, run_id), timeout=120, what="the run")
    assert run["status"] == "trained"
