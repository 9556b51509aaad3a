from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0017_job_sample_rows"),
    ]

    operations = [
        migrations.AddField(
            model_name="chunk",
            name="engine_failures",
            field=models.PositiveSmallIntegerField(default=0),
        ),
    ]
