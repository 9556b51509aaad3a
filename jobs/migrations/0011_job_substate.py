# The sampling wait, made a state of its own: until now a job in `estimating` whose rows
# were counted (row_count set) was waiting for its sampled estimate; it is now in the
# substate `sampling` of `estimating` (jobs.constants.JobSubstate), entered with a JobEvent.
# Job.status is unchanged for every row, so nothing a customer sees moves.

from django.db import migrations, models

WAITING = {"status": "estimating", "row_count__isnull": False}


def into_substate(apps, schema_editor):
    """Jobs waiting for their sample enter the substate, with the event the move now
    writes, dated when they entered the wait (sampled_at: the sample was queued then)."""
    Job = apps.get_model("jobs", "Job")
    JobEvent = apps.get_model("jobs", "JobEvent")
    waiting = Job.objects.filter(**WAITING, substate="")
    JobEvent.objects.bulk_create(
        JobEvent(job_id=pk, from_status="estimating", to_status="sampling",
                 at=sampled_at or leased_at, actor_label="system: migration")
        for pk, sampled_at, leased_at in waiting.values_list("pk", "sampled_at", "leased_at"))
    waiting.update(substate="sampling")


def out_of_substate(apps, schema_editor):
    """Back to the old representation, which row_count alone carries (it is kept; the
    column goes next): the events into the substate go, and a move out of it reads as one
    out of estimating."""
    JobEvent = apps.get_model("jobs", "JobEvent")
    JobEvent.objects.filter(to_status="sampling").delete()
    JobEvent.objects.filter(from_status="sampling").update(from_status="estimating")


STATES = [('submitted', 'Submitted'), ('estimating', 'Estimating'), ('cost_ready', 'Cost Ready'), ('in_progress', 'In Progress'), ('finalizing', 'Finalizing'), ('done', 'Done'), ('failed', 'Failed'), ('cancelling', 'Cancelling'), ('cancelled', 'Cancelled'), ('sampling', 'Sampling')]


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0010_reruns_checks_progress'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='substate',
            field=models.CharField(blank=True, choices=[('sampling', 'Sampling')], default='', max_length=16),
        ),
        migrations.AlterField(
            model_name='jobevent',
            name='from_status',
            field=models.CharField(blank=True, choices=STATES, max_length=16),
        ),
        migrations.AlterField(
            model_name='jobevent',
            name='to_status',
            field=models.CharField(choices=STATES, max_length=16),
        ),
        migrations.RunPython(into_substate, out_of_substate),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('substate', ''), models.Q(('status', 'estimating'), ('substate', 'sampling')), _connector='OR'), name='job_substate_of_its_status'),
        ),
    ]
