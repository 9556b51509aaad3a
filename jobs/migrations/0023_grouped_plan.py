# A prefix-grouped chunk plan (issue 43): the estimate's read keys every JSONL row and keeps
# the planned order and the rows' starts on the plan, a grouped chunk names its rows' byte
# spans, and the job states what its rows share. All nullable: a plan without them is
# contiguous, as every plan before this was.

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0022_chunk_plan"),
    ]

    operations = [
        migrations.AddField(
            model_name="chunkplan",
            name="row_order",
            field=models.BinaryField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="chunkplan",
            name="row_starts",
            field=models.BinaryField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="chunk",
            name="spans",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.BigIntegerField(), blank=True, null=True, size=None),
        ),
        migrations.AddField(
            model_name="job",
            name="est_shared_prefix_share",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="est_identical_rows",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
