"""The gateway's URLs served by their own Django handler, without the site's middleware stack.

A site request passes a dozen middleware (sessions, auth, CSRF, messages, axes, htmx...), each
a thread hop in async mode, and runs in a thread of its own (`ThreadSensitiveContext`): ~8 ms
of CPU per call, more than the gateway's own work (bench/gateway.py). A gateway call needs none
of the session machinery; what applies to it (HTTPS redirect and security headers, the host
check, the body-size limit, Content-Length, X-Frame-Options, CSP) is `GATEWAY_MIDDLEWARE`, a
subset of MIDDLEWARE in the same order, run in the event loop: those middleware only read the
request and set headers. URLs, views, auth, error bodies and recording are the site's own.
"""

import asyncio
import contextlib

from asgiref.sync import markcoroutinefunction
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix
from django.utils.module_loading import import_string

# What the gateway answers; every other path (including other /v1/ ones) is the site's.
GATEWAY_PATHS = frozenset({"/v1/chat/completions", "/v1/models"})


class _InEventLoop:
    """A MiddlewareMixin middleware whose process_request/process_response run in the event
    loop instead of a thread (its async default): they do no I/O."""

    def __init__(self, middleware, get_response) -> None:
        self.process_request = getattr(middleware, "process_request", None)
        self.process_response = getattr(middleware, "process_response", None)
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request):
        response = self.process_request(request) if self.process_request else None
        response = response or await self.get_response(request)
        if self.process_response:
            response = self.process_response(request, response)
        return response


class GatewayHandler(ASGIHandler):
    def load_middleware(self, is_async=False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = convert_exception_to_response(self._get_response_async)
        for path in reversed(settings.GATEWAY_MIDDLEWARE):
            middleware = import_string(path)(handler)
            handler = convert_exception_to_response(_InEventLoop(middleware, handler))
        self._middleware_chain = handler

    async def __call__(self, scope, receive, send) -> None:
        # No ThreadSensitiveContext: it starts a thread per request. The views' few database
        # reads (a key, once per routing.CACHE_SECONDS) share asgiref's one sync thread.
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send) -> None:
        """ASGIHandler.handle without its two thread hops: the request_started/finished
        signals (their receivers check database connections; the gateway's only database work,
        routing's key lookup, runs between the same checks) and `response.close()`, which sends
        request_finished (a gateway response holds no resources but a stream, which closes
        itself). A client that goes away still cancels the view, as in Django."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            return

        async def process_request() -> None:
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away while the answer was sent
            finally:
                for closer in response._resource_closers:
                    closer()

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                    await task
        finally:
            body_file.close()


class GatewayRouter:
    """The gateway's paths to GatewayHandler, everything else to the site."""

    def __init__(self, site) -> None:
        self.site = site
        self.gateway = GatewayHandler()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if path in GATEWAY_PATHS:
                return await self.gateway(scope, receive, send)
        return await self.site(scope, receive, send)
