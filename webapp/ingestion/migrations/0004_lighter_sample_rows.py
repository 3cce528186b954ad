"""Sample rows with fewer things to maintain per row (see the fields' comments in models.py).

- ``HostSample.host``, ``StageSample.sample``, ``StageSample.host``: no index of their own, since
  a composite index begins with each (``hostsample_host_ts`` and ``unique_sample_seq_per_host``,
  ``stagesample_sample_stage``, ``stagesample_host_ts``);
- ``StageSample.host``: no foreign-key constraint in the database (the sample's holds its host).

On PostgreSQL the indexes and the constraint are dropped by name, as the initial migration named
them: Django's own AlterField drops and re-adds the other foreign keys of these tables around the
change, which would validate every stored row again under a lock. Elsewhere (SQLite) Django's
schema editor rebuilds the tables.
"""

import django.db.models.deletion
from django.db import migrations, models

DROPPED = (
    'DROP INDEX IF EXISTS "ingestion_hostsample_host_id_753b6a4d"',
    'DROP INDEX IF EXISTS "ingestion_stagesample_host_id_303c9c7c"',
    'DROP INDEX IF EXISTS "ingestion_stagesample_sample_id_744c80ea"',
    'ALTER TABLE "ingestion_stagesample" '
    'DROP CONSTRAINT IF EXISTS "ingestion_stagesample_host_id_303c9c7c_fk_jobs_host_id"',
)
RESTORED = (
    'ALTER TABLE "ingestion_stagesample" ADD CONSTRAINT '
    '"ingestion_stagesample_host_id_303c9c7c_fk_jobs_host_id" FOREIGN KEY ("host_id") '
    'REFERENCES "jobs_host" ("id") DEFERRABLE INITIALLY DEFERRED',
    'CREATE INDEX "ingestion_stagesample_sample_id_744c80ea" ON "ingestion_stagesample" ("sample_id")',
    'CREATE INDEX "ingestion_stagesample_host_id_303c9c7c" ON "ingestion_stagesample" ("host_id")',
    'CREATE INDEX "ingestion_hostsample_host_id_753b6a4d" ON "ingestion_hostsample" ("host_id")',
)

FIELDS = [
    migrations.AlterField(
        model_name="hostsample",
        name="host",
        field=models.ForeignKey(
            db_index=False,
            on_delete=django.db.models.deletion.CASCADE,
            related_name="samples",
            to="jobs.host",
        ),
    ),
    migrations.AlterField(
        model_name="stagesample",
        name="host",
        field=models.ForeignKey(
            db_constraint=False,
            db_index=False,
            on_delete=django.db.models.deletion.CASCADE,
            related_name="+",
            to="jobs.host",
        ),
    ),
    migrations.AlterField(
        model_name="stagesample",
        name="sample",
        field=models.ForeignKey(
            db_index=False,
            on_delete=django.db.models.deletion.CASCADE,
            related_name="stages",
            to="ingestion.hostsample",
        ),
    ),
]


class Fields(migrations.SeparateDatabaseAndState):
    """The fields' new state; in the database, PostgreSQL's drops by name, or Django's own."""

    def __init__(self):
        super().__init__(state_operations=FIELDS, database_operations=FIELDS)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            for statement in DROPPED:
                schema_editor.execute(statement)
            return
        super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            for statement in RESTORED:
                schema_editor.execute(statement)
            return
        super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0003_stagesample_runqueue_percent"),
        ("jobs", "0003_allocation_layout"),
    ]

    operations = [Fields()]
