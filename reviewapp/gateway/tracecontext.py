"""W3C Trace Context: the trace id an OTel-instrumented harness sends with each call."""

import re

# version-traceid-parentid-flags; a future version may append fields after a dash.
TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
INVALID_VERSION = "ff"


def trace_id_from_traceparent(header: str) -> str | None:
    """The 32-hex trace id of a valid `traceparent`, else None (the spec says ignore it)."""
    match = TRACEPARENT.fullmatch(header.strip())
    if match is None:
        return None
    version, trace_id, parent_id, _flags, rest = match.groups()
    if version == INVALID_VERSION or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return trace_id
