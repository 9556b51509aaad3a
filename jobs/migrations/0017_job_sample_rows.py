from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0016_chunk_started_at_job_metrics_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="sample_rows",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
