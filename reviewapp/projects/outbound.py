"""What a project's settings may reach: the operator's model servers, teacher endpoints and keys.

Outbound addresses and secrets are the deployment's, not a project's. The operator lists the
model servers (MODEL_SERVERS, default VLLM_URL) and the extra teacher endpoints (TEACHER_SERVERS)
in the environment, and declares the keys a teacher may be given (TEACHER_API_KEYS: a name each,
mapped to the environment variable holding it). A project picks among them by value or name;
anything else is refused when it is set, and skipped if it is still stored when it is used (the
operator may shrink a list after a project named an entry). Only base URLs are taken: http or
https, a host, no userinfo, query or fragment; every path under them is built by the caller.
"""

import logging
import os
from urllib.parse import urlsplit

from django.conf import settings

from reviewapp.projects.models import Project

logger = logging.getLogger(__name__)


class OutboundRefused(ValueError):
    """An address or key a project may not use; the message names what is allowed."""


def base_url(url: str) -> str:
    """`url` as a comparable base URL (scheme and host lower-cased, no trailing slash), or
    ValueError naming what is wrong with it."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port  # raises on a port out of range or not a number
    except ValueError as error:
        raise ValueError(f"{text!r} is not a valid URL ({error})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{text!r}: only http and https model servers are allowed")
    if not parts.hostname:
        raise ValueError(f"{text!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{text!r}: credentials in the URL are not allowed")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError(f"{text!r}: a base URL takes no query or fragment")
    if any(char.isspace() for char in text):
        raise ValueError(f"{text!r} contains whitespace")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme.lower()}://{netloc}{parts.path.rstrip('/')}"


def _listed(urls: list[str]) -> tuple[str, ...]:
    listed = []
    for url in filter(str.strip, urls):
        try:
            listed.append(base_url(url))
        except ValueError as error:
            logger.warning("not a model server address, ignored: %s", error)
    return tuple(dict.fromkeys(listed))


def allowed_upstreams(project: Project) -> tuple[str, ...]:
    """The operator's model servers as far as this project goes, the only ones its gateway
    calls and sends VLLM_API_KEY to: MODEL_SERVERS, VLLM_URL (the default server of projects
    that name none) and the project's own upstream (set by the operator with `create_project
    --upstream` or the Django admin, never by the project)."""
    own = [project.upstream_url] if project.upstream_url else []
    return _listed([*settings.MODEL_SERVERS, settings.VLLM_URL, *own])


def allowed_teachers(project: Project) -> tuple[str, ...]:
    """What a project may name as `teacher.url`: its model servers and TEACHER_SERVERS."""
    return tuple(dict.fromkeys([*allowed_upstreams(project), *_listed(settings.TEACHER_SERVERS)]))


def declared_teacher_keys() -> tuple[str, ...]:
    return tuple(sorted(settings.TEACHER_API_KEYS))


def check_upstream(project: Project, url: str) -> str:
    """`url` as a base URL when the project may use it as a model server; else OutboundRefused."""
    return _check(url, allowed_upstreams(project), "MODEL_SERVERS")


def check_teacher_url(project: Project, url: str) -> str:
    return _check(url, allowed_teachers(project), "MODEL_SERVERS or TEACHER_SERVERS")


def check_teacher_key(name: str) -> str:
    if name not in settings.TEACHER_API_KEYS:
        declared = ", ".join(declared_teacher_keys()) or "none"
        raise OutboundRefused(
            f"{name!r} is not a teacher key this deployment declares (TEACHER_API_KEYS); "
            f"declared: {declared}"
        )
    return name


def teacher_key(name: str) -> str | None:
    """The secret behind a declared key name, read from the environment variable the operator
    mapped it to; None for a name the operator does not (or no longer) declare."""
    variable = settings.TEACHER_API_KEYS.get(name) if name else None
    return os.environ.get(variable) or None if variable else None


def usable_upstreams(project: Project, urls: list[str]) -> list[str]:
    """The stored `upstreams` the project may still use; one the operator no longer allows is
    left out (and logged), never called."""
    allowed = set(allowed_upstreams(project))
    usable = []
    for url in urls:
        try:
            normal = base_url(url)
        except ValueError:
            normal = ""
        if normal in allowed:
            usable.append(normal)
        else:
            logger.warning("project %s: upstream %r is not in MODEL_SERVERS; skipped", project, url)
    return usable


def _check(url: str, allowed: tuple[str, ...], setting: str) -> str:
    try:
        normal = base_url(url)
    except ValueError as error:
        raise OutboundRefused(str(error)) from None
    if normal not in allowed:
        raise OutboundRefused(
            f"{normal} is not one of this deployment's servers ({setting}); "
            f"allowed: {', '.join(allowed) or 'none'}"
        )
    return normal
