"""Webhook deliveries: ``POST /hooks/{pipeline}/{trigger}`` (outside the API: no user signs
them; each is checked against its trigger's own secret)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from apps.pipelines.services import triggers


@csrf_exempt
@require_POST
def webhook(request: HttpRequest, pipeline: str, trigger: str) -> JsonResponse:
    """Start the trigger's pipeline for a signed delivery (201), answer a delivery seen before
    with its first outcome (200), refuse an unsigned or wrongly signed one (401)."""
    limit = int(settings.GRAPHENE_WEBHOOK_MAX_BYTES)
    too_big = JsonResponse(
        {"detail": f"the body is larger than {limit:,} bytes (GRAPHENE_WEBHOOK_MAX_BYTES)"}, status=413
    )
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
    if declared > limit:
        return too_big  # before anything is read
    body = request.read(limit + 1)
    if len(body) > limit:
        return too_big
    answer = triggers.webhook_receive(
        pipeline=pipeline,
        name=trigger,
        body=body,
        headers=request.headers,
        remote=str(request.META.get("REMOTE_ADDR", "")),
    )
    return JsonResponse(answer.body, status=answer.status)
