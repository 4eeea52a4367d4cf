"""A run resumed after its tree was deleted has a newer root record; that root's spec now
names the run (``{"run": id}``), so the records' side (traces) finds the run without
reading the runs table. Roots made before this get it here."""

from django.db import migrations
from django.db.models import F


def name_runs(apps, schema_editor):
    Run = apps.get_model("pipelines", "Run")
    Record = apps.get_model("records", "Record")
    resumed = Run.objects.exclude(record_id=None).exclude(record_id=F("id"))
    for run_id, record_id in resumed.values_list("id", "record_id").iterator():
        Record.objects.filter(pk=record_id, kind="graphene.run").update(spec={"run": str(run_id)})


class Migration(migrations.Migration):
    dependencies = [
        ("pipelines", "0002_turns_children_waits"),
        ("records", "0006_record_moved_from"),
    ]

    operations = [migrations.RunPython(name_runs, migrations.RunPython.noop)]
