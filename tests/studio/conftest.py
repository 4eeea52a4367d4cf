"""The Studio's page tests share a logged-in superuser's client (Django's test client: no
network). The Chromium tests define their own ``studio``: a browser on the shared web server."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client


@pytest.fixture
def studio(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_superuser(username="ada", password="pw")
    client = Client()
    client.force_login(user)
    return client
