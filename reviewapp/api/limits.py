"""Refuse oversized bodies before anything reads them, and more work than a process can take."""

from collections.abc import Awaitable, Callable

from asgiref.sync import markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

# Paths that take machine-sized bodies: the JSON API and the gateway.
LIMITED_PREFIXES = ("/api/", "/v1/")


class RequestSizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(LIMITED_PREFIXES):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse(
                    {"error": "bad_request", "detail": "Content-Length is not a number"}, status=400
                )
            if length > settings.INGEST_MAX_BODY_BYTES:
                return body_too_large()
        return self.get_response(request)


def body_too_large() -> JsonResponse:
    limit = settings.INGEST_MAX_BODY_BYTES
    return JsonResponse(
        {
            "error": "payload_too_large",
            "detail": f"the request body is over the limit of {limit} bytes; send smaller batches",
        },
        status=413,
    )


class AdmissionLimitMiddleware:
    """Past a per-process count of requests in flight, answer 503 + Retry-After at once.

    Async only, so under ASGI it runs on the event loop and turns a request away before a
    thread is spent on it. Ingest (/api/) and the gateway (/v1/) have limits of their own; a
    streamed gateway answer counts until its headers are sent.
    """

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]):
        self.get_response = get_response
        self.in_flight = {"api": 0, "gateway": 0}
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            kind, limit = "api", settings.INGEST_MAX_IN_FLIGHT
        elif request.path.startswith("/v1/"):
            kind, limit = "gateway", settings.GATEWAY_MAX_IN_FLIGHT
        else:
            return await self.get_response(request)
        if self.in_flight[kind] >= limit:
            return overloaded(kind)
        self.in_flight[kind] += 1
        try:
            return await self.get_response(request)
        finally:
            self.in_flight[kind] -= 1


def overloaded(kind: str) -> JsonResponse:
    detail = "the server is at its limit of requests in flight; retry after the Retry-After seconds"
    if kind == "gateway":  # the shape OpenAI SDKs parse (and retry on 503)
        body = {"error": {"message": detail, "type": "overloaded", "code": 503}}
    else:
        body = {"error": "overloaded", "detail": detail}
    response = JsonResponse(body, status=503)
    response["Retry-After"] = str(settings.ADMISSION_RETRY_AFTER_SECONDS)
    # Django logs every 5xx as an error; a line per refusal would cost the most exactly when
    # there is nothing to spare (clients see the 503s; bench/load.py counts them).
    response._has_been_logged = True
    return response
