"""Keyset pagination for the API's lists: a page is the rows after the cursor, and the next
page's cursor is the last row's key, opaque to the client."""

import base64
import binascii
from collections.abc import Callable
from typing import TypeVar

from ninja.errors import HttpError

RowT = TypeVar("RowT")


def decode_cursor(cursor: str) -> int:
    try:
        return int(base64.urlsafe_b64decode(cursor.encode()).decode())
    except (binascii.Error, ValueError, UnicodeError):
        raise HttpError(400, "cursor: not a cursor this API returned") from None


def encode_cursor(key: int) -> str:
    return base64.urlsafe_b64encode(str(key).encode()).decode()


def page_of(rows, limit: int, key: Callable[[RowT], int]) -> tuple[list[RowT], str | None]:
    """The first `limit` of `rows` (a queryset after the cursor, or a list fetched `limit + 1`
    long), and the next page's cursor: `key` of the last row shown, None when none follow."""
    fetched = list(rows[: limit + 1])
    page = fetched[:limit]
    return page, encode_cursor(key(page[-1])) if len(fetched) > limit else None
