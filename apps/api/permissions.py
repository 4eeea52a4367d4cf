"""The REST API's one permission class: every view names its rules, the access module decides.

A view declares ``access_resource`` (a resource of ``apps.core.access.RESOURCES``) and
``access_verbs`` (its action → verb, or → ``(verb, resource)`` for an action that acts on
another resource than the view's). A view without a rule for the action it serves refuses
everyone but superusers (and tests/access fails on it). The class checks the verb in the
namespace the request names (``?namespace=``), or, when it names none, that some binding grants
the verb somewhere; selectors then narrow lists and lookups to the namespaces allowed, and
views acting on one object call ``access.require`` with that object's namespace.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotAuthenticated
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from apps.core import access


def rule_of(view: Any, action: str | None) -> tuple[str, str] | None:
    """``(verb, resource)`` the view declares for ``action``, or ``None``."""
    resource = getattr(view, "access_resource", None)
    verbs: dict[str, str | tuple[str, str]] = getattr(view, "access_verbs", {}) or {}
    if resource is None or action is None:
        return None
    verb = verbs.get(action)
    if verb is None:
        return None
    if isinstance(verb, tuple):  # an action on another resource (a pipeline's start makes a run)
        return verb
    return verb, resource


def request_namespace(request: Request) -> str | None:
    """The namespace a request names in its query string, if any."""
    raw = request.query_params.get("namespace")
    return raw or None


def target_namespace(request: Request) -> str:
    """The namespace a request that acts on one thing acts in: the one it names, else the
    default namespace (lists, which span namespaces, use ``request_namespace``)."""
    return request_namespace(request) or access.DEFAULT_NAMESPACE


class AccessPermission(BasePermission):
    """Authenticated, and granted the verb the view's action maps to."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            raise NotAuthenticated("sign in: send `Authorization: Token <key>` (graphenectl login saves one)")
        if hasattr(view, "action_map"):
            action = view.action
            if action is None:
                return True  # a method the viewset does not serve: its 405 follows
        else:
            action = (request.method or "get").lower()
            if not hasattr(view, action):
                return True  # the same for a plain view
        rule = rule_of(view, action)
        if getattr(view, "access_public", False):
            return True  # a read every signed-in caller may make (whoami, kinds)
        if action in getattr(view, "access_narrowed", ()):
            return True  # every signed-in caller, and the view's selector narrows what they get
        if rule is None:
            if access.grants(user).superuser:
                return True
            raise access.AccessDenied(f"{view.__class__.__name__}.{action} has no access rule; only superusers may")
        verb, resource = rule
        namespace = request_namespace(request)
        if resource in access.CLUSTER_RESOURCES:
            if verb in access.READ_VERBS:
                return True  # lists of namespaces, roles, bindings are narrowed by their selectors
            access.require(user, verb, resource, None)
            return True
        if namespace is not None:
            access.require(user, verb, resource, namespace)
            return True
        if not access.grants(user).anywhere(verb, resource):
            raise access.denial(user, verb, resource, access.DEFAULT_NAMESPACE)
        return True
