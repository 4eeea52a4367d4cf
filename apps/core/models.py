"""Abstract bases shared by Graphene's models."""

from django.db import models


class TimeStampedModel(models.Model):
    """``created_at``/``updated_at`` kept by the database layer, always timezone-aware."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class Namespace(models.Model):
    """A boundary a team owns: every record, run, pipeline, stand, secret, agent and artifact
    lives in exactly one, and nothing crosses it. ``default`` exists from the first migration
    (a one-team installation never names another)."""

    name = models.CharField(max_length=63, unique=True)
    description = models.CharField(max_length=400, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.Model):
    """A named set of additive rules. Each rule is ``{"verbs": [...], "resources": [...]}``; ``*``
    matches any verb or resource. Built-in roles (admin, developer, viewer, agent-installer) are
    made by a migration and cannot be changed through the API."""

    name = models.CharField(max_length=63, unique=True)
    description = models.CharField(max_length=400, blank=True)
    rules = models.JSONField(default=list)
    is_builtin = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RoleBinding(models.Model):
    """Grants a role's rules to a user (service accounts are users) or a group, in one namespace,
    or in every namespace when ``namespace`` is ``*``."""

    role = models.ForeignKey(Role, on_delete=models.PROTECT, related_name="bindings")
    namespace = models.CharField(max_length=63, db_index=True)
    user = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.CASCADE, related_name="role_bindings")
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="role_bindings"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["namespace", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="rolebinding_one_subject",
            ),
            models.UniqueConstraint(fields=["role", "namespace", "user"], name="rolebinding_user_unique"),
            models.UniqueConstraint(fields=["role", "namespace", "group"], name="rolebinding_group_unique"),
        ]

    def __str__(self) -> str:
        subject = f"user {self.user_id}" if self.user_id else f"group {self.group_id}"
        return f"{subject} is {self.role_id} in {self.namespace}"
