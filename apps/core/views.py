"""Liveness and readiness probes (no authentication: orchestrators call them), and the CA
certificate clients pin."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from apps.core import health
from apps.core.selectors import tls_ca_pem


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


@require_GET
def tls_ca(request: HttpRequest) -> HttpResponse:
    """The CA certificate that issued this server's certificate (PEM), for clients that pin it
    by fingerprint (``graphenectl login --ca-fingerprint``): a client fetches it, checks its
    fingerprint against the one the operator gave, and from then on trusts only it. Public
    information, so no authentication; 404 when the server's certificate is from a CA the
    machines already trust (``GRAPHENE_TLS_CA_FILE`` unset beside ``GRAPHENE_TLS_CERT_FILE``)."""
    pem = tls_ca_pem()
    if pem is None:
        return HttpResponse(
            "this server names no CA of its own: its certificate is checked against the system's trust store\n",
            status=404,
            content_type="text/plain",
        )
    return HttpResponse(pem, content_type="application/x-pem-file")
