"""Login lockout: per (account, address) pair, and per address past a higher limit.

django-axes compares the largest of its per-parameter failure counts with one limit, so it
cannot lock a pair at 5 and an address at 50; `LockoutHandler` asks `find_lock` instead.
A lock lifts once the failures still inside the cooloff fall below its limit: a stranger's
failures lock only the stranger's address, and a refused try is not counted
(AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False), so the time the page states holds.
"""

import math
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from typing import Literal

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@dataclass(frozen=True)
class Lock:
    scope: Literal["pair", "address"]  # this account from this address, or every account
    ends: datetime


def _lock_ends(attempts: list[tuple[datetime, int]], limit: int) -> datetime | None:
    """When the lock over these (last failure, failures) rows lifts; None if they lock nothing.

    It lifts when the row that brings the newest rows up to the limit leaves the cooloff.
    """
    counted = 0
    for last_failure, failures in sorted(attempts, reverse=True):
        counted += failures
        if counted >= limit:
            return last_failure + get_cool_off()
    return None


def find_lock(*, username: str | None, ip_address: str | None, now: datetime) -> Lock | None:
    """The lock on logging in as `username` from `ip_address`, the later-ending if both."""
    recent = AccessAttempt.objects.filter(
        ip_address=ip_address,
        attempt_time__gte=now - get_cool_off(),  # axes' own window
    ).values_list("username", "attempt_time", "failures_since_start")
    pair = [(last, failures) for name, last, failures in recent if name == username]
    address = [(last, failures) for _, last, failures in recent]
    locks = [
        Lock(scope, ends)
        for scope, ends in (
            ("address", _lock_ends(address, settings.LOGIN_ADDRESS_FAILURE_LIMIT)),
            ("pair", _lock_ends(pair, settings.AXES_FAILURE_LIMIT)),
        )
        if ends
    ]
    return max(locks, key=lambda lock: lock.ends, default=None)  # a tie names the address


class LockoutHandler(AxesDatabaseHandler):
    """axes' database handler, with `find_lock` deciding who is locked."""

    def get_failures(self, request: HttpRequest, credentials: dict | None = None) -> int:
        # axes only compares this with AXES_FAILURE_LIMIT, before and after each failure.
        lock = find_lock(
            username=get_client_username(request, credentials),
            ip_address=request.axes_ip_address,
            now=request.axes_attempt_time,
        )
        return settings.AXES_FAILURE_LIMIT if lock else 0


def lockout_response(
    request: HttpRequest, original_response=None, credentials: dict | None = None
) -> HttpResponse:
    """429 with the time left, in words and in Retry-After, on /login/ and /admin/login/.

    axes' async middleware passes the credentials where `original_response` goes; the username
    then comes from the posted form, which is where they came from.
    """
    now = request.axes_attempt_time
    lock = find_lock(
        username=get_client_username(request, credentials),
        ip_address=request.axes_ip_address,
        now=now,
    ) or Lock("pair", now)  # it ended between axes' check and here
    seconds_left = max(1, math.ceil((lock.ends - now).total_seconds()))
    context = {"scope": lock.scope, "minutes_left": math.ceil(seconds_left / 60)}
    response = render(
        request, "registration/locked_out.html", context, status=HTTPStatus.TOO_MANY_REQUESTS
    )
    response["Retry-After"] = str(seconds_left)
    return response
