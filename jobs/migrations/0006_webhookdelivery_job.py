import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0005_job_events_and_leases"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdelivery",
            name="job",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="webhook_deliveries", to="jobs.job"),
        ),
    ]
