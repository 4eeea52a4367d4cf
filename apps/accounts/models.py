"""API tokens and service accounts.

A token's key is shown once, when it is issued; the table keeps only its SHA-256 digest (to
find the token) and its first characters (to tell tokens apart in a list). Every token expires;
a revoked one stays as a row, so that a refusal can say when and why it was revoked.

A service account is a Django user of its own (``system:serviceaccount:<namespace>:<name>``, no
password, not staff), so that it holds permissions and role bindings as any user does and its
requests are attributed to it, never to the person who created it.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class ServiceAccount(models.Model):
    """A named, non-human identity in a namespace, for a program (CI, a deploy job, a bot).

    Deleting it disables it (``disabled_at``) and revokes its tokens; the row and its user stay,
    so that what it did stays attributed, and its name is not given to a new account (which
    would inherit whatever was granted to the old one by name).
    """

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=63, default="default")
    name = models.CharField(max_length=63)
    description = models.CharField(max_length=500, blank=True)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="service_account")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    disabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="serviceaccount_unique_name")]
        ordering = ["namespace", "name"]

    def __str__(self) -> str:
        return f"service account {self.namespace}/{self.name}"

    @property
    def is_disabled(self) -> bool:
        return self.disabled_at is not None


class AccessToken(models.Model):
    """One API token of a user (a person or a service account's user). Never the key itself.

    ``digest`` is the SHA-256 of the key: keys are 256-bit random values, so a plain hash is as
    strong as a slow one here, and an indexed equality lookup finds the row. ``last_used_at``
    is written at most once a minute per token, not on every request.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key, hex; never the key")
    prefix = models.CharField(max_length=16, help_text="the key's first characters, to tell tokens apart")
    comment = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(help_text="every token expires (GRAPHENE_TOKEN_MAX_TTL_DAYS at most)")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=200, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["user", "-created_at"], name="accesstoken_user_created"),
            # Revoking a user's tokens touches only the live ones.
            models.Index(fields=["user"], name="accesstoken_user_live", condition=Q(revoked_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"token {self.prefix}… of user {self.user_id}"
