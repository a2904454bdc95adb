"""Times for the wake queue: cron expressions and ``--at`` times.

Cron expressions are the usual five fields (minute hour day-of-month month day-of-week,
with ``*``, lists, ranges and steps), or six with a seconds field last, evaluated in UTC
by ``croniter``. A schedule keeps
only its next time: when a worker fires it late it moves to the first time after now, so
the runs missed while no worker was up fire once, not once each.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from croniter import croniter

from lodger.errors import UsageError

__all__ = ["check_cron", "next_fire", "parse_at"]


def check_cron(expression: str) -> str:
    """``expression`` if it is a valid cron expression (five fields, or six with seconds
    last), else ``UsageError``."""
    if len(expression.split()) not in (5, 6) or not croniter.is_valid(expression):
        raise UsageError(
            f"invalid cron expression {expression!r}",
            hint="use five fields: minute hour day-of-month month day-of-week, "
            "e.g. '*/15 * * * *' (UTC)",
            code="invalid_cron",
        )
    return expression


def next_fire(expression: str, after: float) -> float:
    """The first time strictly after ``after`` (seconds since the epoch) that matches."""
    start = datetime.fromtimestamp(after, tz=UTC)
    return float(croniter(check_cron(expression), start).get_next(float))


_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)(s|m|h|d)?$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_at(value: str, *, now: float) -> float:
    """A due time from ``--at``: ``+90s``/``+5m``/``+2h``/``+1d`` from ``now``, an ISO 8601
    time (UTC unless it names an offset), or seconds since the epoch."""
    text = value.strip()
    relative = _RELATIVE.match(text)
    if relative:
        return now + float(relative.group(1)) * _UNIT[relative.group(2) or "s"]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"invalid time {value!r}",
            hint="use +30s, +5m, +2h, +1d, an ISO time such as 2026-12-01T09:00:00Z, "
            "or seconds since the epoch",
            code="invalid_time",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()
