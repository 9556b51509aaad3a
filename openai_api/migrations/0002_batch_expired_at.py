from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("openai_api", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="openaibatch",
            name="expired_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
