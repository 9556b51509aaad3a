from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0014_chunk_unsettled_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="sample_rows",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
