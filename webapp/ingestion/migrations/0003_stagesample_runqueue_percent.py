from django.db import migrations, models


class Migration(migrations.Migration):
    """Each stage's run-queue delay (agents/pipeline/schedstat.py). The database default keeps
    rows stored before it, and inserts from agents older than the field, at 0: not measured."""

    dependencies = [
        ("ingestion", "0002_ranks"),
    ]

    operations = [
        migrations.AddField(
            model_name="stagesample",
            name="runqueue_percent",
            field=models.FloatField(db_default=0, default=0),
        ),
    ]
