"""Websocket routes (Channels)."""

from django.urls import path

from apps.records.consumers import RecordsConsumer

websocket_urlpatterns = [path("ws/records/", RecordsConsumer.as_asgi())]
