"""What a well-behaved client does: resend on a connection error or a 5xx, and keep count."""

import time
from dataclasses import dataclass, field

import httpx

from tests.factories import make_trace

RETRY_PAUSE_S = 0.2
RETRY_DEADLINE_S = 90.0


@dataclass
class IngestLog:
    acknowledged: dict[str, int] = field(default_factory=dict)  # external_id -> 201 or 200
    retries: int = 0
    failures: list[str] = field(default_factory=list)  # answers that were not 207, nor 5xx


def batch(prefix: str, size: int) -> list[dict]:
    return [make_trace(f"{prefix}-{index}") for index in range(size)]


def send_until_acknowledged(
    client: httpx.Client, url: str, headers: dict, traces: list[dict], log: IngestLog
) -> None:
    """POST the batch until the server answers 207; a dead server or a 5xx means send it again."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        try:
            response = client.post(f"{url}/api/v1/traces", json={"traces": traces}, headers=headers)
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code == 207:
            for result in response.json()["results"]:
                log.acknowledged[result["external_id"]] = result["status"]
            return
        if response is not None and response.status_code < 500:
            log.failures.append(f"{response.status_code} {response.text[:200]}")
            return
        log.retries += 1
        if time.monotonic() > deadline:
            raise AssertionError("the server did not come back within the retry deadline")
        time.sleep(RETRY_PAUSE_S)
