"""What each API key resolved to, per process, for a few seconds: the gateway reads a key's
project and routing at most once per CACHE_SECONDS instead of once per call
(reviewapp/gateway/routing.py fills it). Whatever changes what a key resolves to (a revoked key,
a moved route) forgets entries here; other processes catch up within CACHE_SECONDS."""

from typing import Any

CACHE_SECONDS = 2.0

# secret hash -> (monotonic expiry, what the key resolved to: None for no live key)
entries: dict[str, tuple[float, Any]] = {}


def forget_key(secret_hash: str) -> None:
    """A key revoked in this process: its next gateway call reads the database."""
    entries.pop(secret_hash, None)


def forget_all() -> None:
    """A route changed in this process: every key's next gateway call reads the database."""
    entries.clear()
