"""Past its admission limit a web process answers 503 + Retry-After at once, never queues."""

import asyncio
import json

import httpx
import pytest

from reviewapp.api.limits import AdmissionLimit


@pytest.fixture
def limits(settings):
    settings.INGEST_MAX_IN_FLIGHT = 2
    settings.GATEWAY_MAX_IN_FLIGHT = 3
    settings.ADMISSION_RETRY_AFTER_SECONDS = 7
    return settings


class HeldApp:
    """An ASGI app whose requests stay in flight until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope, receive, send) -> None:
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})


async def _call(app, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request through an ASGI app: (status, headers, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": "http", "method": "POST", "path": path, "headers": []}, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body


async def _saturate(path: str, limit: int):
    """Hold `limit` requests in flight, then send one more; then release and send another."""
    inner = HeldApp()
    app = AdmissionLimit(inner)
    held = [asyncio.create_task(_call(app, path)) for _ in range(limit)]
    while inner.entered < limit:
        await asyncio.sleep(0)
    refused = await asyncio.wait_for(_call(app, path), timeout=1)
    inner.release.set()
    answered = await asyncio.gather(*held)
    after = await _call(app, path)
    return refused, answered, after


async def test_it_refuses_ingest_past_the_limit_with_503_retry_after_and_json_error(limits):
    (status, headers, body), answered, after = await _saturate("/api/v1/traces", limit=2)
    assert status == 503
    assert headers["retry-after"] == "7"
    error = json.loads(body)
    assert error["error"] == "overloaded" and error["detail"]
    assert [response[0] for response in answered] == [200, 200]
    assert after[0] == 200  # the slots were given back


async def test_it_refuses_gateway_calls_past_the_limit_with_an_openai_shaped_503(limits):
    (status, headers, body), answered, after = await _saturate("/v1/chat/completions", limit=3)
    assert status == 503
    assert headers["retry-after"] == "7"
    assert json.loads(body) == {
        "error": {
            "message": "the server is at its limit of requests in flight; retry after the "
            "Retry-After seconds",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert [response[0] for response in answered] == [200, 200, 200]
    assert after[0] == 200


async def test_it_counts_ingest_and_gateway_apart_and_leaves_pages_alone(limits):
    inner = HeldApp()
    app = AdmissionLimit(inner)
    held = [asyncio.create_task(_call(app, "/api/v1/traces")) for _ in range(2)]
    gateway = asyncio.create_task(_call(app, "/v1/chat/completions"))
    page = asyncio.create_task(_call(app, "/p/acme/traces/"))
    while inner.entered < 4:
        await asyncio.sleep(0)  # all four admitted, waiting in the app
    inner.release.set()
    assert (await gateway)[0] == (await page)[0] == 200
    await asyncio.gather(*held)


async def test_the_served_application_is_behind_the_limit(settings):
    from reviewapp.asgi import application

    settings.INGEST_MAX_IN_FLIGHT = 0
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        response = await client.post("/api/v1/traces", json={"traces": []})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert set(response.json()) == {"error", "detail"}
