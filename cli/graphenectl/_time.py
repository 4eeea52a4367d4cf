"""Durations (``4h``, ``2h30m``, ``90s``) and how times read in a table (ages, TTLs)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from graphenectl._errors import UsageError

_UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")


def parse_duration(text: str, *, option: str) -> int:
    """Seconds in ``text`` (``1d``, ``4h``, ``2h30m``, ``90s``, or a bare number of seconds); at least 1."""
    raw = text.strip().lower()
    seconds: float
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        seconds = float(raw)
    else:
        parts = _PART.findall(raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise UsageError(f"{option} {text!r} is not a duration; write it like 90s, 15m, 4h, 2h30m or 1d")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds < 1:
        raise UsageError(f"{option} must be at least 1s (got {text!r})")
    return round(seconds)


def parse_time(text: str, *, option: str, now: datetime | None = None) -> str:
    """An ISO 8601 instant for ``text``: a duration ago (``10m``) or an ISO date-time, passed on."""
    raw = text.strip()
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        try:
            ago = parse_duration(raw, option=option)
        except UsageError:
            raise UsageError(
                f"{option} {text!r} is neither a duration (10m, 2h) nor an ISO date-time (2025-01-31T12:00:00Z)"
            ) from None
        return ((now or datetime.now(UTC)) - timedelta(seconds=ago)).isoformat()
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.isoformat()


def parse_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def human_seconds(seconds: float) -> str:
    """Two units at most, as kubectl prints ages: 45s, 3m20s, 4h5m, 2d3h."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        m, s = divmod(s, 60)
        return f"{m}m{s}s" if s and m < 10 else f"{m}m"
    if s < 86400:
        h, rest = divmod(s, 3600)
        m = rest // 60
        return f"{h}h{m}m" if m else f"{h}h"
    d, rest = divmod(s, 86400)
    h = rest // 3600
    return f"{d}d{h}h" if h else f"{d}d"


def age(value: str | None, *, now: datetime | None = None) -> str:
    at = parse_iso(value)
    if at is None:
        return "-"
    return human_seconds(((now or datetime.now(UTC)) - at).total_seconds())


def ttl(expires_at: str | None, *, now: datetime | None = None) -> str:
    """Time left before the record expires: ``3h59m``, ``expired``, or ``-`` when it has no TTL."""
    at = parse_iso(expires_at)
    if at is None:
        return "-"
    left = (at - (now or datetime.now(UTC))).total_seconds()
    return human_seconds(left) if left > 0 else "expired"


def between(start: str | None, end: str | None, *, now: datetime | None = None) -> str:
    began = parse_iso(start)
    if began is None:
        return "-"
    ended = parse_iso(end) or now or datetime.now(UTC)
    seconds = (ended - began).total_seconds()
    return f"{seconds:.1f}s" if seconds < 10 else human_seconds(seconds)


def short_time(value: str | None) -> str:
    """``2025-01-31T12:00:01.234567Z`` → ``2025-01-31 12:00:01.234`` (UTC), for log and event lines."""
    at = parse_iso(value)
    if at is None:
        return "-"
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d}"
