"""A token's status, as the API shows it (derived from its row: nothing stores it)."""

from django.db import models


class TokenStatus(models.TextChoices):
    # Authenticates until its expiry (unless its user is deactivated or its account deleted).
    ACTIVE = "active"
    # Past ``expires_at``: refused; the row stays so that a refusal can say when it expired.
    EXPIRED = "expired"
    # Revoked by someone (``revoked_at``, ``revoked_reason``): refused from that moment on.
    REVOKED = "revoked"
