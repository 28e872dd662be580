"""OTLP/HTTP JSON receiver: GenAI semantic-convention spans become traces, one per trace id."""

from django.http import HttpRequest
from ninja import Router, Status
from ninja.errors import HttpError

from reviewapp.api import schemas
from reviewapp.api.auth import requires
from reviewapp.api.errors import InvalidJson, StrictJsonParser
from reviewapp.api.traces import ERRORS
from reviewapp.ingest.otel import OtlpError, traces_from_otlp
from reviewapp.models import KeyScope, TraceSource
from reviewapp.services.ingest import ingest_traces

router = Router(tags=["opentelemetry"])


@router.post(
    "/otel/v1/traces",
    response={207: schemas.BatchResultOut, **ERRORS},
    summary="Receive OTLP/HTTP JSON spans (GenAI conventions)",
    exclude_none=True,
    **requires(
        KeyScope.INGEST,
        openapi_extra={
            "requestBody": {
                "content": {"application/json": {"schema": {"type": "object"}}},
                "description": "an OTLP ExportTraceServiceRequest in its JSON mapping",
            }
        },
    ),
)
def post_otlp_traces(request: HttpRequest):
    if request.content_type == "application/x-protobuf":
        raise HttpError(415, "send OTLP as JSON (application/json); protobuf is not accepted")
    try:
        payload = StrictJsonParser().parse_body(request)
    except InvalidJson as error:
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
