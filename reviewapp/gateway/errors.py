"""The gateway's errors in OpenAI's exact shape, so every SDK raises its own exception class and
every retry policy treats them as it treats OpenAI's.

OpenAI sends `{"error": {"message", "type", "param", "code"}}`, with `param` and `code` null
where they do not apply (a missing key, unparsable JSON), never the HTTP status as the code.
"""

import functools

from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.log import log_response

from reviewapp.api.openai_errors import SERVER_ERROR, openai_error


def messages_problem(messages: object) -> JsonResponse | None:
    """A 400 in OpenAI's words for a `messages` no model server would take, else None. Only
    the shape is checked: what a message may hold is the model server's to judge."""
    if messages is None:
        return openai_error(
            400,
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(messages, list):
        return openai_error(
            400,
            "Invalid type for 'messages': expected an array, but got "
            f"{_json_type(messages)} instead.",
            param="messages",
            code="invalid_type",
        )
    if not messages:
        return openai_error(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            param="messages",
            code="empty_array",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return openai_error(
                400,
                f"Invalid type for 'messages[{index}]': expected an object, but got "
                f"{_json_type(message)} instead.",
                param=f"messages[{index}]",
                code="invalid_type",
            )
        if "role" not in message:
            return openai_error(
                400,
                f"Missing required parameter: 'messages[{index}].role'.",
                param=f"messages[{index}].role",
                code="missing_required_parameter",
            )
    return None


def _json_type(value: object) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a decimal"}
    names |= {dict: "an object", list: "an array", type(None): "null"}
    return names.get(type(value), "a value")


def openai_error_for_exception(request: HttpRequest, error: Exception) -> JsonResponse:
    """The gateway's answer to an exception: the status Django would give it, in OpenAI's
    shape and never Django's HTML page, DEBUG or not. A 500 is logged as Django logs one."""
    if isinstance(error, Http404):
        return openai_error(404, "not found")
    if isinstance(error, PermissionDenied):
        return openai_error(403, "forbidden")
    if isinstance(error, (BadRequest, SuspiciousOperation, MultiPartParserError)):
        return openai_error(400, f"bad request: {error}")
    log_response(
        "Internal Server Error: %s",
        request.path,
        response=HttpResponse(status=500),
        request=request,
        exception=error,
    )
    return openai_error(
        500,
        "the gateway failed on this call; the error is in the server's log",
        SERVER_ERROR,
    )


def answers_in_openai_shape(view):
    """A gateway view whose every failure is an OpenAI-shaped error (see above)."""

    @functools.wraps(view)
    async def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return await view(request, *args, **kwargs)
        except Exception as error:  # whatever it is, the harness gets JSON
            return openai_error_for_exception(request, error)

    return wrapped
