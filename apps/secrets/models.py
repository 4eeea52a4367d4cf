"""The secret store: named values, encrypted at rest (invariant I7).

Only a secret's *name* ever leaves this table: specs, journals, events, logs and API answers
carry names; the value is decrypted by ``services.secret_resolve`` at the point of use.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.core.models import TimeStampedModel


class Secret(TimeStampedModel):
    """One named secret in a namespace. ``ciphertext`` is a Fernet token; there is no plaintext column.

    The token encrypts the name together with the value, so a ciphertext copied onto another
    row (by someone with write access to the database) does not decrypt as that row's secret.
    """

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=63, default="default")
    name = models.CharField(max_length=128)
    ciphertext = models.TextField(help_text="Fernet token of the name and value; never the value itself")
    # Which configured key encrypted it (a digest of the derived key, not the key): tells an
    # operator which rows still need the old key after GRAPHENE_SECRETS_KEY was rotated.
    key_id = models.CharField(max_length=16)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="secret_unique_name")]
        ordering = ["namespace", "name"]

    def __str__(self) -> str:
        return f"secret {self.namespace}/{self.name}"
