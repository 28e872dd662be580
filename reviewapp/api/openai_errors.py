"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, for everything that
answers on /v1/: the gateway's own refusals (reviewapp/gateway/errors.py) and the limits that
refuse a request before any view reads it (reviewapp/api/limits.py)."""

from django.http import JsonResponse

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


def openai_error_body(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def openai_error(
    status: int,
    message: str,
    error_type: str = INVALID_REQUEST,
    *,
    param: str | None = None,
    code: str | None = None,
) -> JsonResponse:
    return JsonResponse(
        openai_error_body(message, error_type, param=param, code=code), status=status
    )
