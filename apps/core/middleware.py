"""A request that found no free database connection answers 503, not 500.

The web process borrows connections from a bounded pool (settings/base.py). When all are in use
a request waits up to GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS, then psycopg_pool gives up with
``PoolTimeout``, which Django wraps in its ``OperationalError``. That is the server being busy,
not broken: the client may retry, so the answer is 503 with ``Retry-After``, in the API's error
shape under ``/api/``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1


def is_pool_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is the connection pool's timeout."""
    from psycopg_pool import PoolTimeout

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, PoolTimeout):
            return True
        seen = seen.__cause__
    return False


class DatabaseBusyMiddleware:
    """Turns the connection pool's timeout, raised by a view, into a 503."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_pool_timeout(exception):
            return None
        from django.db import connection

        pool = getattr(connection, "pool", None)
        bound = f" (GRAPHENE_WEB_DB_POOL_MAX={pool.max_size})" if pool is not None else ""
        detail = (
            f"every database connection of this server is in use{bound}; "
            f"retry in a moment, or raise the bound if this persists"
        )
        logger.warning("%s %s: %s", request.method, request.path, detail)
        response: HttpResponse
        if request.path.startswith("/api/"):
            response = JsonResponse({"error": "database_busy", "detail": detail, "fields": {}}, status=503)
        else:
            response = HttpResponse(f"Service unavailable: {detail}\n", status=503, content_type="text/plain")
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response


class AuditContextMiddleware:
    """Every HTTP request (the REST API and the Studio) gets a request id, returned as
    ``X-Request-Id`` (a well-formed one the caller sent is kept, so that a proxy's or a
    client's logs meet the audit trail), and the audit context: rows its writes leave carry
    the id and, when a service names no actor, the request's user. The user is read when a row
    is written: DRF authenticates a token inside the view, after this middleware ran."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from apps.core import audit

        request_id = audit.request_id_accept(request.headers.get(audit.REQUEST_ID_HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]  # for views and logs

        def requester() -> audit.Who | None:
            user = getattr(request, "user", None)
            return audit.who_user(user) if user is not None and user.is_authenticated else None

        with audit.acting(requester, request_id=request_id):
            response = self.get_response(request)
        response[audit.REQUEST_ID_HEADER] = request_id
        return response
