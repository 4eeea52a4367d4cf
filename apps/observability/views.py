"""``/metrics``: the Prometheus exposition of the control plane (see ``metrics.py``).

Protected by default: Prometheus sends ``Authorization: Bearer <token>`` (its
``authorization``/``bearer_token_file`` settings); a Graphene API token that authenticates (not
expired or revoked; a service account's suits a scraper) is accepted there (``Token <key>`` too,
as the REST API takes it), or the dedicated ``GRAPHENE_METRICS_TOKEN``.
``GRAPHENE_METRICS_PUBLIC=true`` opens it (a scraper on a private network).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import choose_encoder

from apps.accounts import services as accounts
from apps.observability import metrics


def _authorized(request: HttpRequest) -> bool:
    if settings.GRAPHENE_METRICS_PUBLIC:
        return True
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:  # a Studio session
        return True
    scheme, _, credential = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    credential = credential.strip()
    if scheme.lower() not in ("bearer", "token") or not credential:
        return False
    expected = settings.GRAPHENE_METRICS_TOKEN
    if expected and hmac.compare_digest(credential.encode(), expected.encode()):
        return True
    try:
        accounts.access_token_authenticate(key=credential)
    except accounts.TokenRefused:
        return False
    return True


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        response = HttpResponse(
            "401 Unauthorized: send Authorization: Bearer <a Graphene API token or GRAPHENE_METRICS_TOKEN>\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="graphene-metrics"'
        return response
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    return HttpResponse(encoder(metrics.registry()), content_type=content_type)
