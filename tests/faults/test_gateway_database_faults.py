"""PostgreSQL crash-restarted under gateway traffic: the harness keeps getting answers (routing
from the process's last known state) and every call is recorded once the database is back."""

import threading
import time

import httpx
import pytest

from tests.faults.conftest import PROJECT_MODEL, wait_for

pytestmark = pytest.mark.slow


def test_postgres_restarted_under_gateway_traffic_the_harness_still_gets_answers(stack, headers):
    upstream = stack.upstream()
    stack.execute("UPDATE reviewapp_project SET upstream_url = %s", upstream.url)
    web = stack.web()
    statuses: list[int | str] = []
    stop = threading.Event()

    def call_repeatedly() -> None:
        body = {"model": PROJECT_MODEL, "messages": [{"role": "user", "content": "hello"}]}
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                try:
                    response = client.post(
                        f"{web.url}/v1/chat/completions", json=body, headers=headers
                    )
                    statuses.append(response.status_code)
                except httpx.HTTPError as error:
                    statuses.append(type(error).__name__)
                time.sleep(0.02)

    caller = threading.Thread(target=call_repeatedly)
    caller.start()
    wait_for(lambda: len(statuses) >= 10, timeout=60, what="gateway traffic")
    stack.postgres.stop("immediate")
    during_outage = len(statuses)
    time.sleep(3)  # longer than the routing cache: answers now come from the stale entry
    answered_during_outage = len(statuses) - during_outage
    stack.postgres.start()
    time.sleep(1)
    stop.set()
    caller.join(timeout=30)

    assert answered_during_outage > 0
    assert set(statuses) == {200}, [s for s in statuses if s != 200][:5]
    wait_for(
        lambda: stack.scalar("SELECT count(*) FROM reviewapp_modelcall") == len(statuses),
        timeout=60,
        what="every call to be recorded after the restart",
    )
