"""Abstract bases shared by Graphene's models."""

from django.db import models


class TimeStampedModel(models.Model):
    """``created_at``/``updated_at`` kept by the database layer, always timezone-aware."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
