"""The headers every answer of the web process carries, and the Studio's Content-Security-Policy.

One place decides them, for Django's answers (``SecurityHeadersMiddleware``, first in
``MIDDLEWARE`` so that it also sees the answers ``ApiDoorMiddleware`` rewrites) and for the
static files daphne serves beside Django (``StaticFilesHandler``, in ``asgi.py``), which no
middleware sees:

* ``X-Content-Type-Options: nosniff``, ``Referrer-Policy``, ``Cross-Origin-Opener-Policy`` and,
  on a secure request only, ``Strict-Transport-Security``: Django's ``SecurityMiddleware``
  settings (``SECURE_*``), applied by its own code;
* ``X-Frame-Options: DENY`` (``X_FRAME_OPTIONS``; the Studio never frames itself);
* ``Content-Security-Policy``: ``STUDIO_POLICY`` outside ``/api/`` (scripts and styles only
  from the server's own files, no inline script, no ``eval``; websockets to the page's own
  host), ``API_POLICY`` (nothing may load) on the API's answers other than HTML pages.

Django 5.2 has no Content-Security-Policy of its own (it comes in 6.0); this is the small
middleware the Studio needs rather than django-csp: one fixed policy, one relaxation for
one page (``csp_relax``), no nonces, no reporting endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware

# The Studio's policy. Every script, style, font and image is one of the server's own files
# (the admin's, the Studio's, vendored htmx and xterm.js); data passed to scripts travels in
# data- attributes. ``img-src data:``: the admin's stylesheets draw icons as data: URLs.
STUDIO_POLICY: dict[str, tuple[str, ...]] = {
    "default-src": ("'self'",),
    "script-src": ("'self'",),
    "style-src": ("'self'",),
    "img-src": ("'self'", "data:"),
    "font-src": ("'self'",),
    # 'self' covers ws:/wss: of the page's own host in the CSP Level 3 browsers, not in older
    # ones: the live pages' websockets are named too (the request's host, ``_websocket_sources``).
    "connect-src": ("'self'",),
    "object-src": ("'none'",),
    "base-uri": ("'self'",),
    "form-action": ("'self'",),
    "frame-ancestors": ("'none'",),
}
# The API's JSON, files and event streams are data, never a document: a browser that opens one
# directly runs nothing and loads nothing from it, and no page may frame it.
API_POLICY = "default-src 'none'; frame-ancestors 'none'"

# What a view added for its own answer (``csp_relax``): {directive: sources}.
_RELAXED = "_graphene_csp_relaxed"

Response = TypeVar("Response", bound=HttpResponseBase)


def csp_relax(response: Response, directive: str, *sources: str) -> Response:
    """Add ``sources`` to ``directive`` of this one answer's policy (the rest stays strict).

    For a page whose library cannot work under the strict policy; say why where it is called.
    """
    if directive not in STUDIO_POLICY:
        raise ValueError(f"{directive!r} is not a directive of the Studio's policy: {sorted(STUDIO_POLICY)}")
    relaxed: dict[str, tuple[str, ...]] = getattr(response, _RELAXED, {})
    relaxed[directive] = (*relaxed.get(directive, ()), *sources)
    setattr(response, _RELAXED, relaxed)
    return response


def _websocket_sources(request: HttpRequest) -> tuple[str, ...]:
    try:
        host = request.get_host()  # validated against ALLOWED_HOSTS
    except DisallowedHost:
        return ()
    return (f"ws://{host}", f"wss://{host}") if not request.is_secure() else (f"wss://{host}",)


def studio_policy(request: HttpRequest, relaxed: dict[str, tuple[str, ...]] | None = None) -> str:
    """The Studio's policy for this request, as the header's value."""
    directives = {name: list(sources) for name, sources in STUDIO_POLICY.items()}
    directives["connect-src"].extend(_websocket_sources(request))
    for name, sources in (relaxed or {}).items():
        directives[name].extend(source for source in sources if source not in directives[name])
    return "; ".join(f"{name} {' '.join(sources)}" for name, sources in directives.items())


def _is_api(request: HttpRequest) -> bool:
    return request.path == "/api" or request.path.startswith("/api/")


def _is_html(response: HttpResponseBase) -> bool:
    return response.get("Content-Type", "").split(";")[0].strip().lower() == "text/html"


def content_security_policy(request: HttpRequest, response: HttpResponseBase) -> str | None:
    """The policy ``response`` gets, or None. Under ``/api/`` an HTML page (Swagger UI at
    ``/api/docs/``, whose inline styles and bundled script are its own) has none."""
    if _is_api(request):
        return None if _is_html(response) else API_POLICY
    return studio_policy(request, getattr(response, _RELAXED, None))


def _unused(request: HttpRequest) -> HttpResponse:  # the Django middlewares below only answer
    raise AssertionError("not called")


def security_headers_apply(request: HttpRequest, response: Response) -> Response:
    """Every security header ``response`` lacks: Django's (by its middlewares' own code, from
    the ``SECURE_*`` and ``X_FRAME_OPTIONS`` settings) and the Content-Security-Policy."""
    # Both only set headers, on any answer (a file, a stream); the stubs name HttpResponse.
    SecurityMiddleware(_unused).process_response(request, cast(HttpResponse, response))
    XFrameOptionsMiddleware(_unused).process_response(request, cast(HttpResponse, response))
    if "Content-Security-Policy" not in response:
        policy = content_security_policy(request, response)
        if policy is not None:
            response["Content-Security-Policy"] = policy
    return response


class SecurityHeadersMiddleware:
    """First in ``MIDDLEWARE``: the headers go on every answer, whoever made it. Serves sync
    and async stacks alike (no thread hop under ASGI)."""

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
        return security_headers_apply(request, self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
        return security_headers_apply(request, await get_response(request))


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's static files handler for daphne, with the same headers as every other answer
    (it serves the files without passing them through ``MIDDLEWARE``)."""

    async def get_response_async(self, request: HttpRequest) -> Any:
        response = await super().get_response_async(request)
        return security_headers_apply(request, response)
