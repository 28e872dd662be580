"""The served application answers the gateway's URLs through its own light handler
(reviewapp/gateway/asgi.py), without the site's middleware stack: every answer, error and
header must be what the site's full stack gives for the same request, and calls are recorded.
The model server is the FAKE one of tests/fake_upstream.py."""

import httpx
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import AsyncClient

from reviewapp.gateway.models import ModelCall
from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.projects.services import create_api_key, create_project
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)  # the recorder writes from its own thread

USER = [{"role": "user", "content": "hello there"}]
CHAT = {"model": "shop-agent", "messages": USER}


@pytest.fixture(autouse=True)
def recorder_is_idle_after_each_test():
    yield
    assert recorder.wait_until_idle(15), "a recording leaked past its test"


@pytest.fixture(scope="module")
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def key(upstream) -> str:
    forget_cached_routes()
    project = create_project(slug="shop", upstream_url=upstream.url, served_model="shop-agent")
    return create_api_key(project=project)[1]


@pytest.fixture
def served(monkeypatch):
    """The production ASGI app, and a count of the requests its gateway handler took."""
    from reviewapp.asgi import application

    router = application.app
    taken = []
    gateway = router.gateway

    async def counting(scope, receive, send):
        taken.append(scope["path"])
        await gateway(scope, receive, send)

    monkeypatch.setattr(router, "gateway", counting)
    return application, taken


async def through_served(application, method, path, *, content=b"", headers=None, host=None):
    transport = httpx.ASGITransport(app=application)
    base = f"http://{host or 'testserver'}"
    async with httpx.AsyncClient(transport=transport, base_url=base) as client:
        response = await client.request(method, path, content=content, headers=headers or {})
    return response.status_code, response.content, response.headers


async def through_site(method, path, *, content=b"", headers=None, host=None):
    headers = {**(headers or {}), **({"Host": host} if host else {})}
    client = AsyncClient()
    if method == "GET":
        response = await client.get(path, headers=headers)
    else:
        response = await client.generic(
            method, path, content, content_type="application/json", headers=headers
        )
    body = b"".join([part async for part in response]) if response.streaming else response.content
    return response.status_code, body, response.headers


def comparable(headers) -> dict:
    """Header names and values; the CSP's directives as a set (their order varies per run)."""
    skip = {"content-length", "content-type", "content-security-policy"}
    out = {name.lower(): value for name, value in headers.items() if name.lower() not in skip}
    csp = headers.get("Content-Security-Policy")
    out["csp"] = frozenset(part.strip() for part in csp.split(";")) if csp else None
    out["type"] = headers.get("Content-Type", "").split(";")[0]
    return out


def refused_body(content: bytes):
    body = orjson.loads(content)
    return body if "error" not in body else {**body["error"], "message": body["error"]["message"]}


CASES = [
    pytest.param("POST", "/v1/chat/completions", orjson.dumps(CHAT), True, id="chat"),
    pytest.param("GET", "/v1/models", b"", True, id="models"),
    pytest.param("POST", "/v1/chat/completions", orjson.dumps(CHAT), False, id="no-key"),
    pytest.param("POST", "/v1/chat/completions", b"{nope", True, id="not-json"),
    pytest.param(
        "POST", "/v1/chat/completions", orjson.dumps({"model": "x", "messages": USER}), True,
        id="unknown-model",
    ),
    pytest.param("GET", "/v1/chat/completions", b"", True, id="wrong-method"),
    pytest.param("POST", "/v1/models", b"{}", True, id="models-wrong-method"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "content", "with_key"), CASES)
async def test_the_served_gateway_answers_as_the_full_site_stack_does(
    served, key, method, path, content, with_key
):
    application, taken = served
    headers = {"Authorization": f"Bearer {key}"} if with_key else {}
    if method == "POST":
        headers["Content-Type"] = "application/json"
    status, body, response_headers = await through_served(
        application, method, path, content=content, headers=headers
    )
    assert taken == [path]
    site_status, site_body, site_headers = await through_site(
        method, path, content=content, headers=headers
    )
    assert status == site_status
    assert comparable(response_headers) == comparable(site_headers)
    assert int(response_headers["Content-Length"]) == len(body)
    parsed, site_parsed = orjson.loads(body), orjson.loads(site_body)
    if path.endswith("/completions") and status == 200:  # the fake upstream's ids differ
        assert parsed["choices"] == site_parsed["choices"]
    else:
        assert parsed == site_parsed


async def test_calls_through_the_served_gateway_are_recorded(served, key):
    application, _ = served
    headers = {"Authorization": f"Bearer {key}", "X-Trace-Id": "served-1"}
    status, _, _ = await through_served(
        application, "POST", "/v1/chat/completions", content=orjson.dumps(CHAT), headers=headers
    )
    assert status == 200
    assert await sync_to_async(recorder.wait_until_idle)(15)
    call = await ModelCall.objects.select_related("trace").aget()
    assert call.trace.external_id == "served-1"
    assert call.status_code == 200


async def test_the_served_gateway_streams(served, key):
    application, _ = served
    headers = {"Authorization": f"Bearer {key}"}
    content = orjson.dumps({**CHAT, "stream": True})
    status, body, response_headers = await through_served(
        application, "POST", "/v1/chat/completions", content=content, headers=headers
    )
    assert status == 200
    assert response_headers["Content-Type"].startswith("text/event-stream")
    assert body.rstrip().endswith(b"data: [DONE]")
    assert await sync_to_async(recorder.wait_until_idle)(15)
    assert (await ModelCall.objects.aget()).stream


async def test_an_oversized_body_gets_the_gateways_413(served, key, settings):
    application, _ = served
    settings.INGEST_MAX_BODY_BYTES = 100
    content = orjson.dumps({**CHAT, "messages": USER * 20})
    status, body, _ = await through_served(
        application, "POST", "/v1/chat/completions", content=content,
        headers={"Authorization": f"Bearer {key}"},
    )  # fmt: skip
    assert status == 413
    assert "over the limit of 100 bytes" in orjson.loads(body)["error"]["message"]


async def test_an_unknown_host_is_refused_as_the_site_refuses_it(served, key):
    application, _ = served
    headers = {"Authorization": f"Bearer {key}"}
    status, _, _ = await through_served(
        application, "GET", "/v1/models", headers=headers, host="evil.example"
    )
    site_status, _, _ = await through_site(
        "GET", "/v1/models", headers=headers, host="evil.example"
    )
    assert status == site_status == 400


async def test_other_paths_go_through_the_site(served, key):
    application, taken = served
    status, _, _ = await through_served(application, "GET", "/v1/completions")
    assert status == 404
    assert taken == []


def test_the_gateway_middleware_is_the_sites_own_in_the_same_order():
    positions = [settings.MIDDLEWARE.index(path) for path in settings.GATEWAY_MIDDLEWARE]
    assert positions == sorted(positions)


async def test_a_changed_content_security_policy_is_served_as_the_site_serves_it(
    served, key, settings
):
    """The gateway builds the policies once (GatewayCSPMiddleware); a settings change is seen."""
    application, _ = served
    headers = {"Authorization": f"Bearer {key}"}
    await through_served(application, "GET", "/v1/models", headers=headers)  # policies built
    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {"default-src": ["'none'"]}}
    settings.CONTENT_SECURITY_POLICY_REPORT_ONLY = {"DIRECTIVES": {"img-src": ["'self'"]}}
    _, _, served_headers = await through_served(application, "GET", "/v1/models", headers=headers)
    _, _, site_headers = await through_site("GET", "/v1/models", headers=headers)
    assert comparable(served_headers) == comparable(site_headers)
    assert served_headers["Content-Security-Policy"] == "default-src 'none'"
    assert "img-src 'self'" in served_headers["Content-Security-Policy-Report-Only"]


async def test_each_gateway_path_is_resolved_to_its_own_view(served, key):
    """The handler resolves a path once and reuses the match: each path keeps its own view."""
    application, taken = served
    headers = {"Authorization": f"Bearer {key}"}
    for _ in range(2):
        status, body, _ = await through_served(application, "GET", "/v1/models", headers=headers)
        assert status == 200 and orjson.loads(body)["object"] == "list"
        status, _, _ = await through_served(
            application, "GET", "/v1/chat/completions", headers=headers
        )
        assert status == 405
    assert taken == ["/v1/models", "/v1/chat/completions"] * 2
