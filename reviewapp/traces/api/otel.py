"""OTLP/HTTP receiver: GenAI semantic-convention spans become traces, one per trace id.

Both encodings the OTLP/HTTP spec defines (binary protobuf, the exporters' and the Collector's
default, and JSON), each gzip-compressed or not.
"""

from django.http import HttpRequest
from ninja import Router, Status
from ninja.errors import HttpError

from reviewapp.api.errors import InvalidBody, StrictJsonParser, decoded_body
from reviewapp.api.schemas import ERRORS, ErrorOut
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope
from reviewapp.traces.api import schemas
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import TraceSource
from reviewapp.traces.otel import OtlpError, otlp_json_from_protobuf, traces_from_otlp

router = Router(tags=["opentelemetry"])

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@router.post(
    "/otel/v1/traces",
    response={207: schemas.BatchResultOut, 415: ErrorOut, **ERRORS},
    summary="Receive OTLP/HTTP spans, protobuf or JSON, gzip or not (GenAI conventions)",
    exclude_none=True,
    **requires(
        KeyScope.INGEST,
        openapi_extra={
            "requestBody": {
                "content": {
                    PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                    JSON: {"schema": {"type": "object"}},
                },
                "description": "an OTLP ExportTraceServiceRequest, binary protobuf or its JSON "
                "mapping; `Content-Encoding: gzip` optional",
            }
        },
    ),
)
def post_otlp_traces(request: HttpRequest):
    if request.content_type not in (PROTOBUF, JSON):
        raise HttpError(
            415, f"send OTLP as {PROTOBUF} or {JSON}, not {request.content_type or 'no type'}"
        )
    try:
        if request.content_type == PROTOBUF:
            payload = otlp_json_from_protobuf(decoded_body(request))
        else:
            payload = StrictJsonParser().parse_body(request)
    except InvalidBody as error:
        raise HttpError(error.status, str(error)) from error
    except OtlpError as error:  # bytes that are not a protobuf request, as bad JSON is 400
        raise HttpError(400, str(error)) from None
    if not isinstance(payload, dict):
        raise HttpError(422, "the body must be an OTLP ExportTraceServiceRequest object")
    try:
        items = traces_from_otlp(payload)
    except OtlpError as error:
        raise HttpError(422, str(error)) from None
    results = ingest_traces(
        project=request.auth,
        raw_items=items,
        source=TraceSource.OTEL,
        create_tags=request.api_key.has_scope(KeyScope.REVIEW),
    )
    return Status(207, {"results": [result.as_json() for result in results]})
