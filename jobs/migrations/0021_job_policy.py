# Job.openai ("submitted through the OpenAI surface") becomes the policy it stood for, one
# field per decision the state machine and the estimate make (issue 42 item 4): no approval
# step (approve_at_estimate), every failing row kept (collect_row_errors), and each row's
# body.model held to the job's (row_model, a JobOptions field the job now stores). An OpenAI
# job had all three; every other job none, so nothing a customer sees moves. (A re-run of an
# OpenAI job now keeps row_model from its parent's options: its rows are the parent's, which
# all named the job's model, so its checks answer the same.)

from django.db import migrations, models


def policy_from_flag(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    Job.objects.filter(openai=True).update(approve_at_estimate=True, collect_row_errors=True,
                                           row_model=True)


def flag_from_policy(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    Job.objects.filter(approve_at_estimate=True).update(openai=True)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0020_chunk_engine_failures"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="approve_at_estimate",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="job",
            name="collect_row_errors",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="job",
            name="row_model",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(policy_from_flag, flag_from_policy, elidable=False),
        migrations.RemoveField(
            model_name="job",
            name="openai",
        ),
    ]
