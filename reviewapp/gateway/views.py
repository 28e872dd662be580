"""OpenAI-compatible endpoints: forward first, record after, never hold up the harness."""

import asyncio
import functools
import logging
import time

import httpx
import orjson
from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from reviewapp.api.openai_errors import SERVER_ERROR, openai_error
from reviewapp.gateway.calls import RecordedCall
from reviewapp.gateway.conversation import StreamAssembler
from reviewapp.gateway.errors import answers_in_openai_shape, messages_problem
from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import (
    Destination,
    GatewayProject,
    destination_for,
    project_for_key,
    upstream_health,
)
from reviewapp.gateway.tracecontext import trace_id_from_traceparent
from reviewapp.gateway.upstream import pool, usable_for
from reviewapp.monitors.models import RefusalReason
from reviewapp.monitors.refusals import refusals
from reviewapp.projects.models import KeyScope

logger = logging.getLogger(__name__)

MAX_TRACE_ID_LENGTH = 200
# The server could not take the call (a proxy in front of it, or it is starting or overloaded):
# the call did not run there, so another server may take it.
UNAVAILABLE_STATUS = {502, 503, 504}
_clients: dict[int, httpx.AsyncClient] = {}


def _upstream_client() -> httpx.AsyncClient:
    """One pooled client per event loop (uvicorn runs one loop per worker)."""
    loop_id = id(asyncio.get_running_loop())
    client = _clients.get(loop_id)
    if client is None:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                settings.GATEWAY_READ_TIMEOUT, connect=settings.GATEWAY_CONNECT_TIMEOUT
            ),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        _clients[loop_id] = client
    return client


def answered_termination(response: dict | None) -> str:
    """How an answered call ended: `truncated` when a reply was cut at max_tokens."""
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and any(
        isinstance(choice, dict) and choice.get("finish_reason") == "length" for choice in choices
    ):
        return "truncated"
    return "completed"


async def _project_or_refusal(request: HttpRequest) -> GatewayProject | JsonResponse:
    """The project of the call's key, or the answer that refuses the call: 503 while the
    database is away (the key cannot be checked and this process never saw it), 401 without a
    key it knows, 403 for a key without the ingest scope."""
    # The gateway reads its headers from request.META ("HTTP_" + the name upper-cased, "-" as
    # "_"), what request.headers is made of: making request.headers parses every header name.
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, secret = header.partition(" ")
    project = None
    if scheme.lower() == "bearer" and secret.strip():
        try:
            project = await project_for_key(secret.strip())
        except DatabaseError:
            return _unavailable()
    if project is None:
        return _unauthorized(request)
    if KeyScope.INGEST not in project.key_scopes:
        return _insufficient_scope(project)
    return project


def _unavailable() -> JsonResponse:
    response = openai_error(503, "the database is unavailable; retry shortly", SERVER_ERROR)
    response["Retry-After"] = "1"
    return response


def _unauthorized(request: HttpRequest) -> JsonResponse:
    """OpenAI's two 401s: no key at all (no code), and a key it does not know."""
    refusals.count(project_id=None, reason=RefusalReason.INVALID_API_KEY)
    _, _, secret = request.META.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
    if not secret.strip():
        return openai_error(
            401,
            "You didn't provide an API key. You need to provide your project's API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    return openai_error(
        401,
        "Incorrect API key provided. A project admin finds its keys on the project's API keys "
        "page.",
        code="invalid_api_key",
    )


def _insufficient_scope(project: GatewayProject) -> JsonResponse:
    refusals.count(project_id=project.id, reason=RefusalReason.INSUFFICIENT_SCOPE)
    return openai_error(
        403,
        "this API key lacks the 'ingest' scope the gateway needs; use the harness's key",
        code="insufficient_scope",
    )


def _endpoint(method: str):
    """An OpenAI endpoint: another method, or a key that may not use the gateway, is refused
    before the view runs with the key's project; every failure answers in OpenAI's shape."""

    def decorate(view):
        @csrf_exempt
        @answers_in_openai_shape
        @functools.wraps(view)
        async def endpoint(request: HttpRequest) -> HttpResponse:
            if request.method != method:
                return openai_error(405, f"use {method}")
            project = await _project_or_refusal(request)
            if isinstance(project, JsonResponse):
                return project
            return await view(request, project)

        return endpoint

    return decorate


@_endpoint("GET")
async def list_models(request: HttpRequest, project: GatewayProject) -> HttpResponse:
    return JsonResponse(
        {
            "object": "list",
            "data": [
                {"id": project.served_model, "object": "model", "owned_by": project.slug},
            ],
        }
    )


@_endpoint("POST")
async def chat_completions(request: HttpRequest, project: GatewayProject) -> HttpResponse:
    body, refused = _parsed_body(request)
    trace_id = request.META.get("HTTP_X_TRACE_ID", "").strip()
    if not refused and (len(trace_id) > MAX_TRACE_ID_LENGTH or "/" in trace_id):
        refused = openai_error(400, "X-Trace-Id: at most 200 characters, no '/'")
    if refused:
        refusals.count(project_id=project.id, reason=RefusalReason.INVALID_REQUEST)
        return refused
    # An OTel-instrumented harness names its trace here; OTLP ingest uses the same id, so the
    # call and the harness's spans land in one trace.
    trace_id = trace_id or trace_id_from_traceparent(request.META.get("HTTP_TRACEPARENT", "")) or ""

    destination = destination_for(project, body["model"])
    if destination is None:
        refusals.count(project_id=project.id, reason=RefusalReason.MODEL_NOT_FOUND)
        return openai_error(
            404,
            f"The model `{body['model']}` does not exist or you do not have access to it. This "
            f"project serves `{project.served_model}`.",
            code="model_not_found",
        )
    call = _Call(project, destination, body, trace_id)
    if body.get("stream"):
        return await call.forward_streaming()
    return await call.forward()


def _parsed_body(request: HttpRequest) -> tuple[dict, JsonResponse | None]:
    """The request body, or a 400 as OpenAI words it for one no model server would take:
    nothing refused here reaches the model or becomes a trace."""
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as error:
        return {}, openai_error(
            400,
            f"We could not parse the JSON body of your request ({error}). The API expects a "
            "JSON payload.",
        )
    if not isinstance(body, dict):
        return {}, openai_error(400, "The request body must be a JSON object.")
    if "model" not in body:
        return body, openai_error(400, "you must provide a model parameter")
    if not isinstance(body["model"], str):
        return body, openai_error(
            400,
            "Invalid type for 'model': expected a string.",
            param="model",
            code="invalid_type",
        )
    return body, messages_problem(body.get("messages"))


class RelayedStream(StreamingHttpResponse):
    """Closes its source as soon as the server stops sending (finished or client gone), so the
    call is recorded then, not whenever the garbage collector gets to the generator."""

    def __init__(self, source, **kwargs):
        super().__init__(source, **kwargs)
        self._source = source

    async def __aiter__(self):
        try:
            async for part in super().__aiter__():
                yield part
        finally:
            await self._source.aclose()


class _Call:
    """One forwarded call and what is recorded about it."""

    def __init__(
        self, project: GatewayProject, destination: Destination, body: dict, trace_id: str
    ):
        self.project = project
        self.destination = destination
        self.body = body
        self.trace_id = trace_id
        self.started_at = timezone.now()
        self.started = time.perf_counter()
        self.first_byte: float | None = None
        self.upstream_url = destination.upstream_urls[0]  # the server that took the call

    def _payload(self) -> bytes:
        return orjson.dumps({**self.body, "model": self.destination.upstream_model})

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if settings.VLLM_API_KEY:
            headers["Authorization"] = f"Bearer {settings.VLLM_API_KEY}"
        return headers

    def record(self, *, response, status, termination: str, error: str = "") -> None:
        now = time.perf_counter()
        recorder.submit(
            RecordedCall(
                project_id=self.project.id,
                trace_id_header=self.trace_id,
                requested_model=self.body["model"],
                upstream_model=self.destination.upstream_model,
                adapter_version=self.destination.adapter_version,
                upstream_url=self.upstream_url,
                stream=bool(self.body.get("stream")),
                request=self.body,
                response=response,
                status_code=status,
                termination=termination,
                error=error[:2000],
                started_at=self.started_at,
                latency_ms=(now - self.started) * 1000,
                time_to_first_token_ms=(
                    (self.first_byte - self.started) * 1000 if self.first_byte else None
                ),
            )
        )

    def _failed(self, error: httpx.HTTPError) -> JsonResponse:
        if isinstance(error, httpx.TimeoutException):
            self.record(response=None, status=504, termination="timeout", error=repr(error))
            return openai_error(
                504, "the model server did not answer in time", SERVER_ERROR, code="timeout"
            )
        self.record(response=None, status=502, termination="error", error=repr(error))
        return openai_error(
            502,
            f"the model server is unreachable ({type(error).__name__})",
            SERVER_ERROR,
            code="upstream_unreachable",
        )

    async def _post(self, client: httpx.AsyncClient, *, stream: bool) -> httpx.Response:
        url = f"{self.upstream_url}/chat/completions"
        if usable_for(url):  # the lean client: a plain-HTTP server, no proxy
            return await pool().post(
                url,
                self._payload(),
                self._headers(),
                stream=stream,
                read_timeout=settings.GATEWAY_READ_TIMEOUT,
                connect_timeout=settings.GATEWAY_CONNECT_TIMEOUT,
            )
        request = client.build_request(
            "POST", url, content=self._payload(), headers=self._headers()
        )
        return await client.send(request, stream=stream)

    async def _send(self, *, stream: bool) -> httpx.Response:
        """The answer of the first server that takes the call, healthy servers first, taking
        turns. One that cannot take it (unreachable, 502/503/504) is skipped for a cooldown and
        the next one tried; one that forgot a deployed adapter loads it and gets the call again."""
        client = _upstream_client()
        servers = upstream_health.order(self.destination.upstream_urls)
        for attempt, url in enumerate(servers, start=1):
            self.upstream_url = url
            try:
                response = await self._post(client, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout):  # nothing was sent: try the next
                upstream_health.failed(url)
                if attempt < len(servers):
                    continue
                raise
            except httpx.HTTPError:
                upstream_health.failed(url)
                raise
            if response.status_code in UNAVAILABLE_STATUS:
                upstream_health.failed(url)
                if attempt < len(servers):
                    await response.aclose()
                    continue
                return response
            upstream_health.answered(url)
            if response.status_code == 404 and await self._reloaded_adapter(client, response):
                return await self._post(client, stream=stream)
            return response
        raise AssertionError("a project always has a model server")

    async def _reloaded_adapter(self, client: httpx.AsyncClient, response: httpx.Response) -> bool:
        """A server restarted (or added) since the deploy does not know the adapter: load it
        from the shared adapter store on that server. True when the call should be sent again."""
        if not self.destination.adapter_path or b"does not exist" not in await response.aread():
            return False
        try:
            loaded = await client.post(
                f"{self.upstream_url}/load_lora_adapter",
                json={
                    "lora_name": self.destination.upstream_model,
                    "lora_path": self.destination.adapter_path,
                },
                headers=self._headers(),
            )
        except httpx.HTTPError as error:
            logger.warning("reloading %s failed: %r", self.destination.upstream_model, error)
            return False
        logger.info(
            "reloaded %s on %s: HTTP %s",
            self.destination.upstream_model,
            self.upstream_url,
            loaded.status_code,
        )
        await response.aclose()
        return True  # a 400 "already loaded" means a concurrent call loaded it: send it too

    async def forward(self) -> HttpResponse:
        try:
            upstream = await self._send(stream=False)
        except httpx.HTTPError as error:
            return self._failed(error)
        self.first_byte = time.perf_counter()
        try:
            parsed = orjson.loads(upstream.content)
        except orjson.JSONDecodeError:
            parsed = {"raw": upstream.text[:10_000]}
        ok = upstream.status_code < 400
        self.record(
            response=parsed,
            status=upstream.status_code,
            termination=answered_termination(parsed) if ok else "error",
            error="" if ok else upstream.text[:2000],
        )
        return HttpResponse(
            upstream.content,
            status=upstream.status_code,
            content_type=upstream.headers.get("content-type", "application/json"),
        )

    async def forward_streaming(self) -> HttpResponse:
        try:
            upstream = await self._send(stream=True)
        except httpx.HTTPError as error:
            return self._failed(error)
        if upstream.status_code >= 400:
            content = await upstream.aread()
            await upstream.aclose()
            try:
                parsed = orjson.loads(content)
            except orjson.JSONDecodeError:
                parsed = {"raw": content[:10_000].decode(errors="replace")}
            self.record(
                response=parsed,
                status=upstream.status_code,
                termination="error",
                error=content[:2000].decode(errors="replace"),
            )
            return HttpResponse(
                content,
                status=upstream.status_code,
                content_type=upstream.headers.get("content-type", "application/json"),
            )
        response = RelayedStream(
            self._relay(upstream),
            status=upstream.status_code,
            content_type=upstream.headers.get("content-type", "text/event-stream"),
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    async def _relay(self, upstream: httpx.Response):
        assembler = StreamAssembler()
        termination, error = "client_disconnected", ""
        try:
            async for chunk in upstream.aiter_raw():
                if self.first_byte is None:
                    self.first_byte = time.perf_counter()
                assembler.feed(chunk)
                yield chunk
            termination = answered_termination(assembler.response())
        except httpx.TimeoutException as exc:
            termination, error = "timeout", repr(exc)
        except httpx.HTTPError as exc:
            termination, error = "error", repr(exc)
        finally:
            # Runs on success, upstream failure, and when the client goes away (cancellation).
            await asyncio.shield(upstream.aclose())
            self.record(
                response=assembler.response(),
                status=upstream.status_code,
                termination=termination,
                error=error,
            )
