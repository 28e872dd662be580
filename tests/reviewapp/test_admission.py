"""Past its admission limit a web process answers 503 + Retry-After at once, never queues."""

import asyncio
import json

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from reviewapp.api.limits import AdmissionLimitMiddleware


@pytest.fixture
def limits(settings):
    settings.INGEST_MAX_IN_FLIGHT = 2
    settings.GATEWAY_MAX_IN_FLIGHT = 3
    settings.ADMISSION_RETRY_AFTER_SECONDS = 7
    return settings


async def _saturate(path: str, limit: int):
    """Hold `limit` requests inside the middleware, then send one more."""
    release = asyncio.Event()
    entered = 0

    async def slow_view(request):
        nonlocal entered
        entered += 1
        await release.wait()
        return HttpResponse("done")

    middleware = AdmissionLimitMiddleware(slow_view)
    factory = RequestFactory()
    held = [asyncio.create_task(middleware(factory.post(path))) for _ in range(limit)]
    while entered < limit:
        await asyncio.sleep(0)
    refused = await asyncio.wait_for(middleware(factory.post(path)), timeout=1)
    release.set()
    answered = await asyncio.gather(*held)
    after = await middleware(factory.post(path))
    return refused, answered, after


async def test_it_refuses_ingest_past_the_limit_with_503_retry_after_and_json_error(limits):
    refused, answered, after = await _saturate("/api/v1/traces", limit=2)
    assert refused.status_code == 503
    assert refused["Retry-After"] == "7"
    body = json.loads(refused.content)
    assert body["error"] == "overloaded" and body["detail"]
    assert [response.status_code for response in answered] == [200, 200]
    assert after.status_code == 200  # the slots were given back


async def test_it_refuses_gateway_calls_past_the_limit_with_an_openai_shaped_503(limits):
    refused, answered, after = await _saturate("/v1/chat/completions", limit=3)
    assert [response.status_code for response in answered] == [200, 200, 200]
    assert refused.status_code == 503
    assert refused["Retry-After"] == "7"
    assert json.loads(refused.content)["error"]["type"] == "overloaded"
    assert after.status_code == 200


async def test_it_counts_ingest_and_gateway_apart_and_leaves_pages_alone(limits):
    release = asyncio.Event()

    async def slow_view(request):
        await release.wait()
        return HttpResponse("done")

    middleware = AdmissionLimitMiddleware(slow_view)
    factory = RequestFactory()
    held = [asyncio.create_task(middleware(factory.post("/api/v1/traces"))) for _ in range(2)]
    await asyncio.sleep(0.01)
    gateway = asyncio.create_task(middleware(factory.post("/v1/chat/completions")))
    page = asyncio.create_task(middleware(factory.get("/p/acme/traces/")))
    await asyncio.sleep(0.01)
    assert not gateway.done() and not page.done()  # admitted, waiting in the view
    release.set()
    assert (await gateway).status_code == (await page).status_code == 200
    await asyncio.gather(*held)


def test_it_answers_a_real_ingest_request_503_when_the_limit_is_zero(api, settings):
    settings.INGEST_MAX_IN_FLIGHT = 0
    response = api.post("/api/v1/traces", {"traces": []})
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert set(response.json()) == {"error", "detail"}
