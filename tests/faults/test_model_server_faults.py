"""The model server dies under the gateway: the harness gets 502s (not hangs), each call is
recorded with its error, and a deploy it dies in ends deploy_failed with routing unchanged."""

import threading
import time

import httpx
import pytest

from tests.faults.conftest import (
    PROJECT_MODEL,
    approve_a_correction,
    finished_run,
    use_tiny_base,
    wait_for,
)

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0  # the client's own limit; nothing here may come near it


def test_model_server_killed_during_gateway_traffic_answers_502_and_records_errors(stack, headers):
    upstream = stack.upstream()
    # The project's model is the fake's "drip-model": its streams last 6 s, so one is in flight
    # when the server dies (plain calls answer at once whatever the model).
    stack.execute(
        "UPDATE reviewapp_project SET upstream_url = %s, upstream_model = 'drip-model'",
        upstream.url,
    )
    web = stack.web()
    outcomes: list[tuple[bool, int | str, float]] = []  # (streamed, status or error, seconds)
    stop = threading.Event()

    def call_repeatedly(stream: bool) -> None:
        body = {
            "model": PROJECT_MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "stream": stream,
        }
        with httpx.Client(timeout=CALL_TIMEOUT_S) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    with client.stream(
                        "POST", f"{web.url}/v1/chat/completions", json=body, headers=headers
                    ) as response:
                        response.read()
                        outcome: int | str = response.status_code
                except httpx.HTTPError as error:
                    outcome = type(error).__name__
                outcomes.append((stream, outcome, time.monotonic() - started))

    callers = [threading.Thread(target=call_repeatedly, args=(s,)) for s in (False, False, True)]
    for caller in callers:
        caller.start()
    wait_for(lambda: len(outcomes) >= 20, timeout=60, what="gateway traffic")
    upstream.kill()
    killed_at = len(outcomes)
    time.sleep(3)
    stop.set()
    for caller in callers:
        caller.join(timeout=CALL_TIMEOUT_S)

    assert not any(caller.is_alive() for caller in callers)
    plain = [outcome for streamed, outcome, _ in outcomes if not streamed]
    assert set(plain) <= {200, 502}
    assert plain[-1] == 502 and plain.count(502) >= 2
    assert max(seconds for _, _, seconds in outcomes[killed_at:]) < 10  # no hangs
    # The gateway forwards first and records after: wait for the recorder, then count.
    wait_for(
        lambda: stack.scalar("SELECT count(*) FROM reviewapp_modelcall") == len(outcomes),
        timeout=30,
        what="every call to be recorded",
    )
    recorded_502 = stack.scalar(
        "SELECT count(*) FROM reviewapp_modelcall WHERE status_code = 502 AND termination = 'error'"
    )
    assert recorded_502 == sum(1 for _, outcome, _ in outcomes if outcome == 502)
    assert web.process.poll() is None


def test_model_server_dying_during_a_deploy_ends_deploy_failed_with_routing_unchanged(
    stack, headers, make_tiny_llama, make_tiny_tokenizer
):
    upstream = stack.upstream("--die-on", "/load_lora_adapter")
    use_tiny_base(stack, make_tiny_llama, make_tiny_tokenizer, auto_deploy=True)
    stack.execute("UPDATE reviewapp_project SET upstream_url = %s", upstream.url)
    project_id = stack.scalar("SELECT id FROM reviewapp_project")
    stack.execute(
        'INSERT INTO reviewapp_modelroute (project_id, "primary", canary, canary_share, '
        "previous_primary, updated_at, revision) VALUES (%s, 'acme-v0', '', 0, '', now(), 0)",
        project_id,
    )
    web = stack.web()
    stack.worker()
    approve_a_correction(stack, web, headers)
    run_id = httpx.post(f"{web.url}/api/v1/runs", json={}, headers=headers).json()["id"]
    run = wait_for(lambda: finished_run(web, headers, run_id), timeout=180, what="the run")

    assert upstream.process.poll() is not None  # the model server did die mid-deploy
    assert run["status"] == "deploy_failed"
    assert "routing unchanged" in run["error"]
    route = stack.query('SELECT "primary", canary, canary_share FROM reviewapp_modelroute')
    assert route == [("acme-v0", "", 0)]
