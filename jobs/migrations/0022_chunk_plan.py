# A JSONL job's chunk plan, recorded by its estimate's read of the input, so the start does
# not read the input whole again (issue 42 item 2). A job estimated before this has none and
# is planned by reading, as before.

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0021_job_policy"),
    ]

    operations = [
        migrations.CreateModel(
            name="ChunkPlan",
            fields=[
                ("job", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                             primary_key=True, related_name="chunk_plan",
                                             serialize=False, to="jobs.job")),
                ("chunk_rows", models.PositiveIntegerField()),
                ("chunk_ends", django.contrib.postgres.fields.ArrayField(
                    base_field=models.PositiveBigIntegerField(), size=None)),
            ],
        ),
    ]
