"""Every API error is JSON `{"error": <code>, "detail": <what to fix>}`; nothing becomes a 500."""

import logging
import zlib
from http import HTTPStatus

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from reviewapp.api.limits import body_too_large

logger = logging.getLogger(__name__)


class MissingScope(Exception):
    """A live key without any of the scopes the route needs (403, not 401: the key is valid)."""

    def __init__(self, needed: tuple[str, ...], held: list[str]):
        self.needed = needed
        wanted = " or ".join(repr(scope) for scope in needed)
        super().__init__(
            f"this API key lacks the {wanted} scope this route needs (it has: "
            f"{', '.join(held) or 'none'}); a project admin can create a key with it on the "
            "API keys page or with `manage.py create_api_key <project> --scope <scope>`"
        )


def field_path(location: tuple) -> str:
    """('messages', 3, 'tool_calls', 0) -> 'messages[3].tool_calls[0]'."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("str", "list[ContentPart]", "function-after[fields_fit_the_role(), Message]"):
            continue  # pydantic's names for union branches and validators, not fields
        else:
            path += f".{part}" if path else str(part)
    return path


def error_response(status: int, detail: str, error: str | None = None) -> JsonResponse:
    code = error or HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    return JsonResponse({"error": code, "detail": detail}, status=status)


class InvalidBody(ValueError):
    """A body that cannot be read as sent; `status` and `code` say how to answer."""

    status = 400
    code = "invalid_request"


class InvalidJson(InvalidBody):
    code = "invalid_json"


class InvalidGzip(InvalidBody):
    code = "invalid_gzip"


class UnsupportedEncoding(InvalidBody):
    status = 415
    code = "unsupported_encoding"


def decoded_body(request: HttpRequest) -> bytes:
    """The body with its Content-Encoding (gzip or none) undone, within the ingest size limit."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return request.body
    if encoding != "gzip":
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported; send gzip or no Content-Encoding"
        )
    limit = settings.INGEST_MAX_BODY_BYTES
    # wbits 16 + MAX_WBITS: the gzip container; max_length stops a small bomb from filling memory
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        body = decompressor.decompress(request.body, limit + 1)
    except zlib.error as error:
        raise InvalidGzip(
            f"Content-Encoding is gzip but the body is not valid gzip ({error})"
        ) from None
    if len(body) > limit:
        raise RequestDataTooBig
    if not decompressor.eof:
        raise InvalidGzip("Content-Encoding is gzip but the gzip body is truncated")
    return body


def describe_json_error(body: bytes, error: orjson.JSONDecodeError) -> str:
    at = body[error.pos : error.pos + 9].lstrip(b"-")
    if at.startswith((b"NaN", b"Infinity")):
        return f"NaN and Infinity are not valid JSON numbers (at character {error.pos})"
    return f"the body is not valid JSON: {error}"


class StrictJsonParser(Parser):
    """orjson: fast, and it refuses NaN/Infinity, lone surrogates and runaway nesting."""

    def parse_body(self, request: HttpRequest):
        body = decoded_body(request)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise InvalidJson(describe_json_error(body, error)) from None


def install_error_handlers(api: NinjaAPI) -> None:
    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        # ninja wraps parser failures in a generic 400; the cause says what was wrong.
        if isinstance(exc.__cause__, InvalidBody):
            cause = exc.__cause__
            return error_response(cause.status, str(cause), cause.code)
        if isinstance(exc.__cause__, RequestDataTooBig):
            return body_too_large()
        return error_response(exc.status_code, str(exc))

    @api.exception_handler(ValidationError)
    def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        problems = []
        for detail in exc.errors[:5]:
            location = detail.get("loc", ())
            # ninja prefixes the parameter source ("body", "query", "path") and the argument name
            location = location[2:] if location[:1] == ("body",) else location[1:]
            path = field_path(tuple(location))
            problems.append(f"{path}: {detail['msg']}" if path else detail["msg"])
        return error_response(422, "; ".join(problems), "invalid_request")

    @api.exception_handler(AuthenticationError)
    def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        response = error_response(
            401, "send a live project API key as 'Authorization: Bearer <key>'", "unauthorized"
        )
        response["WWW-Authenticate"] = "Bearer"
        return response

    @api.exception_handler(MissingScope)
    def missing_scope(request: HttpRequest, exc: MissingScope) -> HttpResponse:
        response = error_response(403, str(exc), "insufficient_scope")
        # RFC 6750's name for it, so OAuth-aware clients recognise the refusal
        response["WWW-Authenticate"] = (
            f'Bearer error="insufficient_scope", scope="{" ".join(exc.needed)}"'
        )
        return response

    @api.exception_handler(Http404)
    def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return error_response(404, str(exc) or "not found", "not_found")

    @api.exception_handler(RequestDataTooBig)
    def too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        return body_too_large()

    @api.exception_handler(DatabaseError)
    def database_error(request: HttpRequest, exc: DatabaseError) -> HttpResponse:
        logger.warning("database error on %s: %s", request.path, exc)
        if isinstance(exc, DataError):  # input validation let through what the column can't hold
            return error_response(
                400, "a value the database cannot store (a NUL character?)", "invalid_request"
            )
        if not isinstance(exc, OperationalError | InterfaceError):
            return unexpected(request, exc)
        # A restarting database: nothing was stored that was not acknowledged, so a retry is safe.
        response = error_response(503, "the database is unavailable; retry shortly", "unavailable")
        response["Retry-After"] = "1"
        return response

    @api.exception_handler(Exception)
    def unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
        logger.exception("unhandled API error on %s", request.path)
        return error_response(500, "an internal error; it has been logged", "internal_error")
