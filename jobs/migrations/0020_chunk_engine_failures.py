from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0019_job_merge_claim"),
    ]

    operations = [
        migrations.AddField(
            model_name="chunk",
            name="engine_failures",
            field=models.PositiveSmallIntegerField(default=0),
        ),
    ]
