"""The door every HTTP request passes first: its path and query string must be storable text
(a NUL character in ``?label=`` would otherwise reach PostgreSQL), and every error answer under
``/api/`` leaves in the API's JSON shape, whoever made it (a view, a parser, Django's CSRF
check, a server error)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from apps.api.errors import as_json_error, error_response, graphene_error_response, is_api
from apps.core import throttle, validation
from apps.core.errors import GrapheneError


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """The answer to a request whose path or query cannot be served, None if it can."""
    try:
        validation.check_text(request.path, field="path")
        validation.check_params(request.GET)
    except GrapheneError as exc:
        if is_api(request):
            return graphene_error_response(exc)
        return HttpResponseBadRequest(exc.detail, content_type="text/plain; charset=utf-8")
    return None


class ApiDoorMiddleware:
    """Early in ``MIDDLEWARE`` (only the security headers' come before it): it refuses before
    sessions, CSRF or a view read anything, and sees every answer after them. Serves sync and
    async stacks alike (no thread hop under ASGI)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        refused = _refusal(request)
        if refused is not None:
            return refused
        response = self.get_response(request)
        return as_json_error(response) if is_api(request) else response

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        refused = _refusal(request)
        if refused is not None:
            return refused
        get_response: Callable[[HttpRequest], Awaitable[HttpResponse]] = self.get_response
        response = await get_response(request)
        return as_json_error(response) if is_api(request) else response


class AuthFailureThrottleMiddleware:
    """Failed token authentications under ``/api/``, limited per client address
    (``apps/core/throttle.py``): a 401 answer counts one; an address over the limit is answered
    429 (``throttled``, with ``Retry-After``) before its credentials are judged, until the
    window ends. After ``AuthenticationMiddleware``: a user logged in to the Studio (the
    session) has authenticated already and is neither counted nor refused."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if not is_api(request) or (user is not None and user.is_authenticated):
            return self.get_response(request)
        address = throttle.request_client_address(request)
        wait = throttle.auth_failure_throttled(address)
        if wait is not None:
            refused = error_response(429, "throttled", throttle.throttled_detail(wait))
            refused["Retry-After"] = str(wait)
            return refused
        response = self.get_response(request)
        if response.status_code == 401:
            throttle.auth_failure_record(address=address)
        return response
