"""ASGI entry point: HTTP through Django, websockets through Channels' router."""

import os

from django.core.asgi import get_asgi_application

from graphene_project import process

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "graphene_project.settings.dev")
# An ASGI server loading this module is the web process (its database connections are pooled);
# the graphene command has named its process already (then this changes nothing).
process.declare(process.WEB)

# Django must be set up before anything imports models (consumers, routing).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from apps.accounts.websocket_auth import SessionAuthMiddlewareStack, TokenAuthMiddleware  # noqa: E402
from apps.core.proxy import TrustedProxyMiddleware  # noqa: E402
from apps.core.security import StaticFilesHandler  # noqa: E402
from apps.core.throttle import WebsocketAuthFailureThrottle  # noqa: E402
from graphene_project.routing import websocket_urlpatterns  # noqa: E402

# Daphne does not serve static files; the admin's few assets are served by Django's static
# handler (collected under STATIC_ROOT in production, found in the apps otherwise), with the
# security headers of every other answer (apps/core/security.py).
# Websockets authenticate with the session cookie (the Studio: Channels' middleware, its user
# looked up off Channels' one shared database thread) or, for clients that are not
# browsers (graphenectl), with the REST API's token in an Authorization header. Refusals
# (4401) of clients not logged in are counted per address, and limited (apps/core/throttle.py).
# X-Forwarded-* headers count only from GRAPHENE_TRUSTED_PROXIES; everyone else's are dropped
# before anything reads them (apps/core/proxy.py).
application = TrustedProxyMiddleware(
    ProtocolTypeRouter(
        {
            "http": StaticFilesHandler(django_asgi_app),
            "websocket": AllowedHostsOriginValidator(
                SessionAuthMiddlewareStack(
                    WebsocketAuthFailureThrottle(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
                )
            ),
        }
    )
)
