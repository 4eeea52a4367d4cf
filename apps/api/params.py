"""Query parameters into typed values, for the REST views and the websocket consumers: a
malformed value is a 400 naming its field (``ValidationFailed``), never a guess. Selectors
take the typed values; they never see a request."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS

from apps.core import validation
from apps.core.errors import ValidationFailed

# The bounds of ``after`` (a line id) and ``tail`` (a number of lines).
MAX_LINE_ID = 2**62
MAX_TAIL = 10_000
# The longest duration an input takes in seconds (a TTL, an extension): a hundred years.
MAX_SECONDS = 100 * 365 * 86400


class StrictInteger(serializers.IntegerField):
    """A JSON integer, as run inputs are (``graphene_sdk.validation``): not ``true``, not
    ``"60"``, not ``60.0`` (DRF's IntegerField takes all three)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class DoorChecks:
    """The door's checks for a viewset, once the caller is authenticated and allowed, before
    any lookup or change:

    * ids in its URL (``path_ids``: URL keyword → what it names): a malformed one is a 400
      naming it (``id``, ``command_id``), not a 404: no row could ever have that id;
    * its body, parsed (and so checked: size, depth, storable values) even by an action that
      does not read it: a cancel with a broken body is refused, not carried out;
    * its query: a parameter is given once, except those in ``repeatable_params`` (label
      selectors): ``?limit=5&limit=abc`` is a 400, not whichever value a parser keeps.
    """

    path_ids: dict[str, str] = {}
    repeatable_params: frozenset[str] = frozenset({"label"})

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]  # a mixin before a DRF view
        for name in request.query_params:
            given = len(request.query_params.getlist(name))
            if given > 1 and name not in self.repeatable_params:
                raise ValidationFailed(
                    f"{name} is given {given} times; give it once" + _list_hint(name),
                    fields={name: ["given more than once"]},
                )
        for kwarg, noun in self.path_ids.items():
            if kwarg in kwargs:
                validation.parse_uuid(kwargs[kwarg], field="id" if kwarg == "pk" else kwarg, noun=noun)
        if request.method not in SAFE_METHODS and request.negotiator.select_parser(request, request.parsers):
            _ = request.data  # a body no parser of this view takes (a raw upload) is the view's own


def _list_hint(name: str) -> str:
    return " (several values go comma-separated: ?status=failed,cancelled)" if name in {"status", "phase"} else ""


def int_param(params: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within [lo, hi], ``default`` if absent; a field error otherwise."""
    return validation.parse_int(params.get(name), field=name, default=default, lo=lo, hi=hi)


def datetime_param(params: Mapping[str, str], name: str) -> Any:
    """An ISO 8601 query parameter (naive means UTC), None if absent; a field error if malformed."""
    raw = params.get(name)
    if not raw:
        return None
    try:
        value = parse_datetime(raw)
    except ValueError:  # well formed, but no such date (month 13, hour 25)
        value = None
    if value is None:
        raise ValidationFailed(f"{name}={raw!r} is not an ISO 8601 date-time", fields={name: ["not a date-time"]})
    if timezone.is_naive(value):
        value = timezone.make_aware(value, dt.UTC)
    try:
        # In UTC: PostgreSQL takes offsets up to 15:59 only (ISO 8601 allows up to 23:59).
        return value.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00: before the first instant Python holds (or after the last)
        early = value.year == dt.MINYEAR
        return (dt.datetime.min if early else dt.datetime.max).replace(tzinfo=dt.UTC)


def log_filter_params(params: Mapping[str, str]) -> dict[str, Any]:
    """The filters of a record's log (``grep``, ``severity``, ``since``, ``until``,
    ``descendants``), as ``observability.selectors.log_rows`` takes them."""
    return {
        "descendants": bool_param(params, "descendants", default=True),
        "grep": params.get("grep"),
        "min_severity": params.get("severity"),
        "since": datetime_param(params, "since"),
        "until": datetime_param(params, "until"),
    }


def log_start_params(params: Mapping[str, str], last_event_id: str = "") -> dict[str, Any]:
    """Where a live follow starts (``after``, ``tail`` and a ``Last-Event-ID``), as
    ``observability.selectors.log_start`` takes them."""
    after = int_param(params, "after", 0, 0, MAX_LINE_ID)
    resumed = last_event_id.isdigit()  # a reconnecting client: where it was wins over ``tail``
    return {
        "after": after,
        "last_event_id": int(last_event_id) if resumed else None,
        "tail": 0 if resumed else int_param(params, "tail", 0, 1, MAX_TAIL),
    }


_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def bool_param(params: Mapping[str, str], name: str, default: bool = False) -> bool:
    """A boolean query parameter (``true``/``false``, ``1``/``0``, ``yes``/``no``, any case),
    ``default`` if absent; anything else is a field error (not a silent false)."""
    raw = params.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValidationFailed(f"{name}={raw!r} must be true or false", fields={name: ["must be true or false"]})


def uuid_param(params: Mapping[str, str], name: str, noun: str = "record") -> str | None:
    """An id query parameter, None if absent; given but not a UUID (empty too) is a field error."""
    raw = params.get(name)
    return None if raw is None else str(validation.parse_uuid(raw, field=name, noun=noun))
