"""One error shape for every API answer: ``{"error": code, "detail": text, "fields": {...}}``.

Whatever raised it: a view or a service (``exception_handler``, DRF's hook), a parser (the
same hook), Django itself (an unknown path under ``/api/``, a body over Django's bound, a CSRF
failure, a server error: ``ApiDoorMiddleware`` in ``apps/api/middleware.py`` and the handlers
here turn those into the same shape).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.core import validation
from apps.core.errors import GrapheneError

API_PREFIX = "/api/"

# The code of an error answer Django (not the API) made, by status.
CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
    500: "server_error",
    502: "bad_gateway",
    503: "unavailable",
}


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX) or request.path == API_PREFIX.rstrip("/")


def error_body(code: str, detail: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": code, "detail": detail, "fields": fields or {}}


def error_response(status_code: int, code: str, detail: str, fields: dict[str, Any] | None = None) -> JsonResponse:
    return JsonResponse(error_body(code, detail, fields), status=status_code)


def graphene_error_response(exc: GrapheneError) -> JsonResponse:
    return error_response(exc.status_code, exc.code, exc.detail, exc.fields)


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(detail, list) and detail and all(not isinstance(d, dict | list) for d in detail):
        return {prefix or "non_field_errors": [str(d) for d in detail]}
    if isinstance(detail, list):
        out = {}
        for i, value in enumerate(detail):
            out.update(_flatten(value, f"{prefix}.{i}" if prefix else str(i)))
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):  # Django's bound (DATA_UPLOAD_MAX_MEMORY_SIZE), read by DRF
        exc = validation.too_large()
    if isinstance(exc, GrapheneError):
        return Response(error_body(exc.code, exc.detail, exc.fields), status=exc.status_code)
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        summary = "; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items())
        return Response(
            error_body("validation_failed", f"invalid request: {summary}", fields),
            status=status.HTTP_400_BAD_REQUEST,
        )
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" in response.data:
        code = getattr(getattr(exc, "detail", None), "code", None) or getattr(exc, "default_code", "error")
        response.data = error_body(str(code), str(response.data["detail"]))
    return response


def as_json_error(response: HttpResponse) -> HttpResponse:
    """An error answer under ``/api/`` in the API's shape, whoever made it (the API's own pass)."""
    if response.status_code < 400 or response.streaming:
        return response
    content_type = response.get("Content-Type", "").split(";")[0].strip()
    body: Any = None
    try:
        body = json.loads(response.content) if response.content else None
    except ValueError:
        body = None
    if isinstance(body, dict) and set(body) == {"error", "detail", "fields"}:
        if content_type != "application/json":  # rendered by a view's other renderer (SSE, downloads)
            response["Content-Type"] = "application/json"
        return response
    code = CODES.get(response.status_code, "error")
    detail = f"HTTP {response.status_code}: {code.replace('_', ' ')}"
    if isinstance(body, dict) and isinstance(body.get("detail"), str):  # JSON, but not the API's shape
        detail = body["detail"]
    elif response.status_code == 403:
        detail = "forbidden (a CSRF check failed: the API takes an Authorization: Token header)"
    replaced = error_response(response.status_code, code, detail)
    for header in ("Allow", "WWW-Authenticate", "Retry-After"):
        if header in response:
            replaced[header] = response[header]
    return replaced


# --- Django's own error views (urls.py handler400..500, settings.CSRF_FAILURE_VIEW) -----------


def _with_slash(path: str) -> str | None:
    """``path/`` if that is an endpoint (every API path ends with a slash), else None."""
    if path.endswith("/"):
        return None
    try:
        match = resolve(f"{path}/")
    except Resolver404:
        return None
    return f"{path}/" if match.func is not not_found else None


@csrf_exempt
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Any path under ``/api/`` that names nothing (instead of the Studio's login redirect).
    A GET of an endpoint's path without its final slash is redirected, as Django's
    ``APPEND_SLASH`` would; other methods are told the path (a redirect would lose the body)."""
    slashed = _with_slash(request.path)
    if slashed is not None and request.method in ("GET", "HEAD"):
        query = request.META.get("QUERY_STRING", "")
        return HttpResponsePermanentRedirect(slashed + (f"?{query}" if query else ""))
    hint = (
        f"did you mean {slashed}? (API paths end with a slash)"
        if slashed is not None
        else "the API's routes are listed at /api/v1/ and described at /api/schema/"
    )
    return error_response(404, "not_found", f"no API endpoint at {request.path!r}; {hint}")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        if isinstance(exception, RequestDataTooBig):
            return graphene_error_response(validation.too_large())
        return error_response(400, "bad_request", str(exception or "") or "the request cannot be served")
    if isinstance(exception, RequestDataTooBig):
        return HttpResponse("The request's body is too large.", status=413, content_type="text/plain")
    return defaults.bad_request(request, exception or Exception())


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return error_response(403, "permission_denied", str(exception or "") or "permission denied")
    return defaults.permission_denied(request, exception or Exception())


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return not_found(request)
    return defaults.page_not_found(request, exception or Exception())


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return error_response(500, "server_error", "the server failed to answer; its log has the details")
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if is_api(request):
        return error_response(
            403, "csrf_failed", f"CSRF check failed ({reason}): the API takes an Authorization: Token header"
        )
    return django_csrf_failure(request, reason)
