"""The audit trail's table, and on PostgreSQL the trigger that makes it append-only: every
UPDATE is refused, and every DELETE unless the transaction set ``graphene.audit_prune`` to
``on`` (only the retention task, ``apps.core.audit.audit_prune``, does). TRUNCATE is not a row
change and is left to the database's owner (a test database's flush uses it).

On SQLite (embedded mode: one process, for trying Graphene out) the trigger is not made."""

from django.db import migrations, models

TRIGGER = """
CREATE OR REPLACE FUNCTION graphene_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('graphene.audit_prune', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit trail is append-only: % of core_auditentry refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'rows older than GRAPHENE_AUDIT_RETENTION_DAYS are removed by the retention task';
END
$$;
CREATE TRIGGER core_auditentry_append_only
    BEFORE UPDATE OR DELETE ON core_auditentry
    FOR EACH ROW EXECUTE FUNCTION graphene_audit_append_only();
"""

DROP_TRIGGER = """
DROP TRIGGER IF EXISTS core_auditentry_append_only ON core_auditentry;
DROP FUNCTION IF EXISTS graphene_audit_append_only();
"""


def trigger_create(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRIGGER, params=None)


def trigger_drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_TRIGGER, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0002_builtin_roles'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('created_at', models.DateTimeField()),
                ('actor_kind', models.CharField(choices=[('user', 'User'), ('run', 'Run'), ('agent', 'Agent'), ('system', 'System')], max_length=8)),
                ('actor_id', models.CharField(blank=True, max_length=64)),
                ('actor_name', models.CharField(max_length=150)),
                ('action', models.CharField(max_length=40)),
                ('resource', models.CharField(max_length=20)),
                ('object_id', models.CharField(max_length=64)),
                ('object_name', models.CharField(blank=True, max_length=253)),
                ('namespace', models.CharField(max_length=63)),
                ('request_id', models.CharField(blank=True, max_length=64)),
                ('before_digest', models.CharField(blank=True, max_length=64, null=True)),
                ('after_digest', models.CharField(blank=True, max_length=64, null=True)),
                ('detail', models.JSONField(blank=True, default=dict)),
            ],
            options={
                'indexes': [models.Index(fields=['created_at', 'id'], name='audit_created'), models.Index(fields=['object_id', 'created_at'], name='audit_object'), models.Index(condition=models.Q(('request_id', ''), _negated=True), fields=['request_id'], name='audit_request')],
            },
        ),
        migrations.RunPython(trigger_create, trigger_drop),
    ]
