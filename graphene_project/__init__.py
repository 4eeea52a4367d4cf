"""Graphene: a control plane for CI and infrastructure."""

from graphene_project.celery import app as celery_app

__all__ = ["celery_app"]
__version__ = "0.1.0"
