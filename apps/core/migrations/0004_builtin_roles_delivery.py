"""The built-in roles learn the delivery resources: everyone who reads pipelines reads their
sources and revisions; developers deliver code (sources, revisions) and activate revisions
(``update`` on pipelines)."""

from django.db import migrations

from apps.core.access import BUILTIN_ROLES


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    Role = apps.get_model("core", "Role")
    for name, spec in BUILTIN_ROLES.items():
        Role.objects.update_or_create(
            name=name, defaults={"description": spec["description"], "rules": spec["rules"], "is_builtin": True}
        )


class Migration(migrations.Migration):
    dependencies = [("core", "0003_audit_trail")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
