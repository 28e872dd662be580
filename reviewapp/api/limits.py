"""Refuse oversized bodies before anything reads them."""

from collections.abc import Callable

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
