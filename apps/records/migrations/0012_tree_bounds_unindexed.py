"""Records' tree bounds (``lft``, ``rght``) in no index, and room on each page for updates.

A declaration moves the bounds of the records to the right of its owner. While an index held
``lft`` each moved row was a new row version with an entry in every index of the table; now
those updates are HOT (heap-only): the new version stays on its page and no index changes,
provided the page has room, hence a fill factor of 70 (PostgreSQL). The tree's root, which
every change to a tree's shape locks, is found through ``record_root``; protected records of
a tree through ``record_protected_in_tree``.
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def fill_factor(percent: int):  # type: ignore[no-untyped-def]  # a migration's RunPython callable
    def run(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE records_record SET (fillfactor = {percent})")

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("records", "0011_record_held_by"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="record", name="record_tree_lft"),
        migrations.RemoveIndex(model_name="record", name="record_protected"),
        migrations.AddIndex(
            model_name="record",
            index=models.Index(condition=models.Q(("parent__isnull", True)), fields=["tree_id"], name="record_root"),
        ),
        migrations.AddIndex(
            model_name="record",
            index=models.Index(
                condition=models.Q(("protected", True)), fields=["tree_id"], name="record_protected_in_tree"
            ),
        ),
        migrations.RunPython(fill_factor(70), fill_factor(100)),
    ]
