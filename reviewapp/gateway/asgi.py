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
import http

from asgiref.sync import markcoroutinefunction
from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.middleware import CheckableLazyObject, CSPMiddleware
from csp.utils import build_policy
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.urls import get_resolver, set_script_prefix
from django.utils.module_loading import import_string

from reviewapp.api.openai_errors import openai_error
from reviewapp.gateway.errors import answers_in_openai_shape

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


# The site's settings' policies, built once: (CONTENT_SECURITY_POLICY's, the report-only one's).
_csp_policies: tuple[str, str] | None = None
# django-csp's per-view policy attributes (csp.decorators); an answer with any goes to django-csp.
_PER_VIEW_POLICY = (
    "_csp_config",
    "_csp_update",
    "_csp_replace",
    "_csp_config_ro",
    "_csp_update_ro",
    "_csp_replace_ro",
)


@receiver(setting_changed)
def _forget_csp_policies(*, setting, **kwargs) -> None:
    global _csp_policies
    if setting.startswith("CONTENT_SECURITY_POLICY"):
        _csp_policies = None


class GatewayCSPMiddleware(CSPMiddleware):
    """django-csp's CSPMiddleware with the policies built once instead of per answer (~0.1 ms
    of CPU a call: two `build_policy` of the settings' directives). A gateway answer uses no
    nonce and no per-view policy, so its headers are the settings' policies; an answer that
    does have either goes to django-csp. The rest is django-csp 4.0's process_response."""

    def process_response(self, request, response):
        if getattr(request, "_csp_nonce", None) is not None or any(
            getattr(response, name, None) is not None for name in _PER_VIEW_POLICY
        ):
            return super().process_response(request, response)
        exempted_debug_codes = (http.HTTPStatus.INTERNAL_SERVER_ERROR, http.HTTPStatus.NOT_FOUND)
        if response.status_code in exempted_debug_codes and settings.DEBUG:
            return response
        global _csp_policies
        if _csp_policies is None:
            _csp_policies = (build_policy(), build_policy(report_only=True))
        policy, policy_ro = _csp_policies
        if policy and _applies(request, response, HEADER, "_csp_exempt", "CONTENT_SECURITY_POLICY"):
            response[HEADER] = policy
        if policy_ro and _applies(
            request,
            response,
            HEADER_REPORT_ONLY,
            "_csp_exempt_ro",
            "CONTENT_SECURITY_POLICY_REPORT_ONLY",
        ):
            response[HEADER_REPORT_ONLY] = policy_ro
        # As django-csp: a nonce asked for after the header was written is an error.
        if getattr(request, "_csp_nonce", None) is None:
            request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response


def _applies(request, response, header: str, exempt: str, setting: str) -> bool:
    """django-csp's test: no such header yet, the answer not exempted, the path not excluded."""
    prefixes = (getattr(settings, setting, None) or {}).get("EXCLUDE_URL_PREFIXES", None) or ()
    return (
        header not in response
        and getattr(response, exempt, False) is False
        and not request.path_info.startswith(tuple(prefixes))
    )


class GatewayHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        # The view of each gateway path, resolved once per URLconf (get_resolver's cache).
        self._resolved: tuple[object, dict] = (None, {})

    def load_middleware(self, is_async=False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        # In place of Django's convert_exception_to_response: an exception below any layer (a
        # middleware's, say) is answered in OpenAI's shape, never as Django's HTML page.
        handler = answers_in_openai_shape(self._get_response_async)
        for path in reversed(settings.GATEWAY_MIDDLEWARE):
            middleware = _EVENT_LOOP_VERSIONS.get(path) or import_string(path)
            handler = answers_in_openai_shape(_InEventLoop(middleware(handler), handler))
        self._middleware_chain = handler

    def resolve_request(self, request):
        """The site's URLconf resolves each gateway path once (walking its ~50 patterns took
        ~0.07 ms a call); the same match is given to every call of that path."""
        if hasattr(request, "urlconf"):  # a middleware chose another URLconf: as Django does
            return super().resolve_request(request)
        resolver = get_resolver()
        cached_resolver, matches = self._resolved
        if cached_resolver is not resolver:
            matches = {}
            self._resolved = (resolver, matches)
        match = matches.get(request.path_info)
        if match is None:
            match = matches[request.path_info] = resolver.resolve(request.path_info)
        request.resolver_match = match
        return match

    async def __call__(self, scope, receive, send) -> None:
        # No ThreadSensitiveContext: it starts a thread per request. The views' few database
        # reads (a key, once per key_cache.CACHE_SECONDS) share asgiref's one sync thread.
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
        if request is None:  # a request Django cannot build (an undecodable path, say)
            body_file.close()
            await self.send_response(
                openai_error(error_response.status_code, "the request could not be read"), send
            )
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


# GATEWAY_MIDDLEWARE entries served by a version of the gateway's own (same headers).
_EVENT_LOOP_VERSIONS = {"csp.middleware.CSPMiddleware": GatewayCSPMiddleware}


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
