"""Liveness and readiness probes (no authentication: orchestrators call them)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from apps.core import health


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving requests."""
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """The database, broker and channel layer are reachable; 503 names what is not. With the
    state of the web's database connection pool (``database_pool``; null where there is none)."""
    checks = health.run_all()
    body = {
        "status": "ok" if all(c.ok for c in checks) else "unavailable",
        "checks": {c.name: {"ok": c.ok, "detail": c.detail, "setting": c.setting} for c in checks},
        "database_pool": health.database_pool(),
    }
    return JsonResponse(body, status=200 if body["status"] == "ok" else 503)
