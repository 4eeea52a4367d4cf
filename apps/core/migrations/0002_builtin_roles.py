"""The built-in roles and the default namespace. Users that exist when this runs (an
installation from before access control, where every signed-in user could do nearly anything)
are bound as developers in the default namespace, so nobody loses their work on upgrade."""

from django.db import migrations

from apps.core.access import BUILTIN_ROLES, DEFAULT_NAMESPACE


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    Role = apps.get_model("core", "Role")
    Namespace = apps.get_model("core", "Namespace")
    RoleBinding = apps.get_model("core", "RoleBinding")
    User = apps.get_model("auth", "User")
    for name, spec in BUILTIN_ROLES.items():
        Role.objects.update_or_create(
            name=name, defaults={"description": spec["description"], "rules": spec["rules"], "is_builtin": True}
        )
    Namespace.objects.get_or_create(name=DEFAULT_NAMESPACE, defaults={"description": "the installation's first"})
    developer = Role.objects.get(name="developer")
    for user in User.objects.filter(is_superuser=False, is_active=True):
        RoleBinding.objects.get_or_create(role=developer, namespace=DEFAULT_NAMESPACE, user=user)


class Migration(migrations.Migration):
    dependencies = [("core", "0001_access")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
