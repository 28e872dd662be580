"""Refuse oversized bodies before anything reads them, and more work than a process can take."""

from collections.abc import Callable

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from reviewapp.api.openai_errors import SERVER_ERROR, openai_error, openai_error_body

# Paths that take machine-sized bodies: the JSON API and the gateway.
LIMITED_PREFIXES = ("/api/", "/v1/")
GATEWAY_PREFIX = "/v1/"  # answers in OpenAI's error shape, the API in its own


class RequestSizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.process_request(request) or self.get_response(request)

    def process_request(self, request: HttpRequest) -> JsonResponse | None:
        """The refusal of an oversized (or unmeasurable) body, else None. The gateway's handler
        calls it directly (reviewapp/gateway/asgi.py)."""
        if request.path.startswith(LIMITED_PREFIXES):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                if request.path.startswith(GATEWAY_PREFIX):
                    return openai_error(400, "Content-Length is not a number")
                return JsonResponse(
                    {"error": "bad_request", "detail": "Content-Length is not a number"}, status=400
                )
            if length > settings.INGEST_MAX_BODY_BYTES:
                if request.path.startswith(GATEWAY_PREFIX):
                    return openai_error(413, _too_large_detail())
                return body_too_large()
        return None


def _too_large_detail() -> str:
    limit = settings.INGEST_MAX_BODY_BYTES
    return f"the request body is over the limit of {limit} bytes; send smaller batches"


def body_too_large() -> JsonResponse:
    return JsonResponse({"error": "payload_too_large", "detail": _too_large_detail()}, status=413)


class AdmissionLimit:
    """ASGI wrapper around the whole app: past a per-process count of requests in flight,
    answer 503 + Retry-After at once.

    It runs before Django reads the body or spends a thread on the request, so a refusal costs
    almost nothing, and it counts a request until the last byte of its response (a streamed
    gateway answer included). Ingest (/api/) and the gateway (/v1/) have limits of their own.
    """

    def __init__(self, app) -> None:
        self.app = app
        self.in_flight = {"api": 0, "gateway": 0}

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith("/api/"):
            kind, limit = "api", settings.INGEST_MAX_IN_FLIGHT
        elif path.startswith("/v1/"):
            kind, limit = "gateway", settings.GATEWAY_MAX_IN_FLIGHT
        else:
            return await self.app(scope, receive, send)
        if self.in_flight[kind] >= limit:
            return await _refuse(send, kind)
        self.in_flight[kind] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight[kind] -= 1

        async def send_then_release(message) -> None:
            # The slot is free once the last byte goes out, not when Django's clean-up after
            # the response is done: a client's next request may already be on its way.
            if message["type"] == "http.response.body" and not message.get("more_body"):
                release()
            await send(message)

        try:
            return await self.app(scope, receive, send_then_release)
        finally:
            release()


async def _refuse(send, kind: str) -> None:
    detail = "the server is at its limit of requests in flight; retry after the Retry-After seconds"
    if kind == "gateway":  # OpenAI's shape for an overloaded server (SDKs retry on 503)
        body = openai_error_body(detail, SERVER_ERROR)
    else:
        body = {"error": "overloaded", "detail": detail}
    headers = [
        (b"content-type", b"application/json"),
        (b"retry-after", str(settings.ADMISSION_RETRY_AFTER_SECONDS).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})
