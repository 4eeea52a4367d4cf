"""``/agents/download``: the agent zipapp, for install scripts (public: it holds no secret)."""

from __future__ import annotations

from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.http import require_safe

from apps.agents.bundle import agent_bundle


@require_safe
def download(request: HttpRequest) -> HttpResponseBase:
    """The .pyz (built on first use); ``?sha256`` answers its checksum in sha256sum format."""
    bundle = agent_bundle()
    headers = {"X-Graphene-Agent-SHA256": bundle.sha256, "X-Graphene-Agent-Version": bundle.version}
    if "sha256" in request.GET:
        return HttpResponse(f"{bundle.sha256}  graphene-agent.pyz\n", content_type="text/plain", headers=headers)
    response = FileResponse(
        bundle.path.open("rb"), as_attachment=True, filename="graphene-agent.pyz", content_type="application/zip"
    )
    for name, value in headers.items():
        response[name] = value
    return response
