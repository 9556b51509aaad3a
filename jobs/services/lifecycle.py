"""The job state machine (docs/dev/style.md rules 1 and 3). `job_transition` is the one writer of
Job.status (and of Job.substate, the internal step of a status: the sampling wait); the
named services below (created, cost_ready, approve, cancel, finish) are a few lines each
around it, called alike by the API, the console and the workers.

The moves it allows and where a cancel stops a job are data (jobs.constants
JOB_STATE_TRANSITIONS, CANCELLABLE); what happens on entering a state is written once,
here. So is the job's lease on the work its state waits for (leased_at, claimed,
attempts): fresh with every move, claimed by a worker, renewed by the recovery pass, each
through one helper below.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from anex.errors import Conflict, DomainError, Forbidden, PaymentRequired
from billing.services import hold_place, hold_settle, organization_lock
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction
from console.models import ApiKey
from console.services import member_spend_require
from inference.pricing import usage_json
from jobs import dispatch
from jobs.constants import (
    CANCELLABLE,
    JOB_STATE_TRANSITIONS,
    SUBSTATE_OF,
    TERMINAL_STATUSES,
    ChunkStatus,
    FailureCode,
    JobState,
    JobStatus,
    job_state,
    job_state_fields,
)
from jobs.models import Job, JobEvent
from jobs.services import webhooks
from jobs.services.chunks import IN_FLIGHT, chunks_skip_pending, chunks_skip_waiting
from jobs.services.metering import job_usage_done
from jobs.services.purge import job_data_purge

logger = logging.getLogger(__name__)

# The system as it acts on a job: the workers' own moves, and the recovery pass's.
WORKER = Actor(system="worker")
RECOVERY = Actor(system="recovery")
AUTO_APPROVE = Actor(system="auto-approve")
# The state's own work starts with the move (the worker that moves a job to estimating or
# finalizing is the one running it), so its lease is held from that moment.
CLAIMED_ON_ENTRY = frozenset({JobStatus.ESTIMATING, JobStatus.FINALIZING})


def _sources(to: JobState) -> frozenset[JobState]:
    return frozenset(src for src, targets in JOB_STATE_TRANSITIONS.items() if to in targets)


def _lease_fresh(to: JobState, now: datetime) -> dict[str, Any]:
    """The lease every move starts on the new state's work (jobs.services.recovery)."""
    return {"leased_at": now, "claimed": to in CLAIMED_ON_ENTRY, "attempts": 0}


@transaction.atomic
def job_transition(*, job: Job, to: JobState, actor: Actor,
                   sources: frozenset[JobState] | None = None, cost_cents: int = 0,
                   **fields: Any) -> Job | None:
    """Move the job to `to` (a status, or a substate of one) when the state it is in is
    one the table allows (narrowed to `sources` when given); None, and nothing written,
    when it is not - a repeat is a no-op.

    In the same commit: the other `fields`, a JobEvent, a fresh lease for the new state's
    work (jobs.services.recovery), the state's own effects, and the webhook of the status
    entered (a substate is no move of the status a customer sees: it sends none):
    - sampling: nothing more (its caller records the counts and the reservation).
    - cost_ready: cost_ready_at. (cancelling: its caller, job_cancel, has recorded the
      cancel: _cancel_request.)
    - in_progress: approved_at and the hold on est_cost_cents (402 when it is not covered,
      and then nothing of the move is kept); the run is sent on commit.
    - done, failed, cancelled: finished_at and data_expires_at (the reference: set once
      the job is terminal, the result kept ANEX_RESULT_RETENTION_DAYS); its usage, recorded
      (Job.usage, unless `fields` carry it: job_finalize's); the hold settled on
      `cost_cents` (released in full at 0); a data deletion asked for meanwhile, on commit.
    """
    allowed = _sources(to)
    if sources is not None:
        if not sources <= allowed:
            raise ValueError(f"{sorted(sources - allowed)} -> {to} is not a job transition")
        allowed = sources
    terminal = to in TERMINAL_STATUSES
    if to == JobStatus.IN_PROGRESS or terminal:
        # It moves credits: the organization row first, then the job (billing.services).
        organization_lock(job.organization_id)
    status, substate = Job.objects.select_for_update().values_list(
        "status", "substate").get(pk=job.pk)
    current = job_state(status, substate)
    if current not in allowed:
        return None
    now = timezone.now()
    values = _lease_fresh(to, now)
    if to == JobStatus.COST_READY:
        values["cost_ready_at"] = now
    elif to == JobStatus.IN_PROGRESS:
        values["approved_at"] = now
    elif terminal:
        values["finished_at"] = now
        values["data_expires_at"] = now + timedelta(days=settings.ANEX_RESULT_RETENTION_DAYS)
        if "usage" not in fields:  # job_finalize records what it charged on itself
            values["usage"] = usage_json(job_usage_done(job.pk))
    entering = job_state_fields(to)
    moved = Job.objects.filter(pk=job.pk, status=status, substate=substate).update(
        status=entering["status"], substate=entering["substate"], **values, **fields)
    assert moved == 1, "the job row is locked; its status cannot have moved"
    JobEvent.objects.create(job_id=job.pk, from_status=current, to_status=to, at=now,
                            actor_label=actor.label)
    entered = Job.objects.select_related("organization").get(pk=job.pk)
    if to == JobStatus.IN_PROGRESS:
        hold_place(job=entered)
        dispatch.send_on_commit("job_start_task", str(entered.pk))
    elif terminal:
        entered.cost_cents = hold_settle(job=entered, cost_cents=cost_cents)
        Job.objects.filter(pk=job.pk).update(cost_cents=entered.cost_cents)
        if entered.data_delete_requested:
            _purge_after_commit(entered.pk)
    if to not in SUBSTATE_OF:
        webhooks.job_webhook_enqueue(job=entered, status=to)
    return entered


def _purge_after_commit(job_id: uuid.UUID) -> None:
    # Storage deletes are not transactional: they follow the commit. A process that dies
    # in between leaves the deletion to the recovery pass ("requested data deletion").
    def purge() -> None:
        job_data_purge(job=Job.objects.select_related("input").get(pk=job_id))

    transaction.on_commit(purge)


def job_lease_claim(*, job_id: uuid.UUID | str, state: JobState) -> bool:
    """A worker takes the work the job's state waits for, once: a duplicate or redelivered
    message finds it taken. The recovery pass hands it out again when its lease runs out."""
    return Job.objects.filter(pk=job_id, claimed=False, **job_state_fields(state)).update(
        claimed=True, leased_at=timezone.now()) == 1


def job_lease_beat(*, job_id: uuid.UUID | str, state: JobState) -> bool:
    """The worker holding the job's claimed work is alive (a long finalize's merge): its
    lease starts again, so the recovery pass does not hand the work out to a second one."""
    return Job.objects.filter(pk=job_id, claimed=True, **job_state_fields(state)).update(
        leased_at=timezone.now()) == 1


def job_lease_renew(*, job: Job) -> bool:
    """The recovery pass hands the job's work out again: one more attempt and a new lease,
    unclaimed. Only while the job is in the state and on the lease it was read with, so
    however many passes run it is renewed once, and a job that moved on is left alone."""
    return Job.objects.filter(pk=job.pk, leased_at=job.leased_at,
                              **job_state_fields(job.state)).update(
        leased_at=timezone.now(), claimed=False, attempts=F("attempts") + 1) == 1


def job_finalize_send(*, job: Job) -> None:
    """Send the job's finalize (jobs.tasks.job_finalize_task: every chunk has settled, or
    it has none) once the current transaction commits, within the time its rows' merge
    needs (jobs.dispatch.finalize_time_limit_ms). The claim is the finalize's own
    (finalizing entered, or its lease taken), so a repeat sends a no-op."""
    dispatch.finalize_send(job_id=job.pk, rows=job.row_count or 0)


@transaction.atomic
def job_created(*, job: Job, actor: Actor) -> None:
    """A new job's first event (the submit's transaction): created in submitted."""
    JobEvent.objects.create(job=job, from_status="", to_status=JobStatus.SUBMITTED,
                            at=job.created_at, actor_label=actor.label)
    webhooks.job_webhook_enqueue(job=job, status=JobStatus.SUBMITTED)


def job_cost_ready(*, job: Job, estimate: dict[str, Any]) -> JobStatus | None:
    """estimating -> cost_ready with the estimate, then what follows at once: a data
    deletion asked for meanwhile stops it unbilled; auto-approve approves it."""
    ready = job_transition(job=job, to=JobStatus.COST_READY, actor=WORKER, **estimate)
    if ready is None:
        return None
    if ready.data_delete_requested or ready.cancel_requested:
        # A cancel reaches a job before cost_ready only when it is approved at its
        # estimate (job_cancel): it stops here, unbilled, instead of being approved.
        job_finish(job=ready, status=JobStatus.CANCELLED)
        return JobStatus.CANCELLED
    if ready.approve_at_estimate:
        return job_approve_at_estimate(job=ready)
    if ready.organization.auto_approve:
        job_auto_approve(job=ready)
    return JobStatus.COST_READY


def job_approve_at_estimate(*, job: Job) -> JobStatus:
    """A job without an approval step (Job.approve_at_estimate): approved for the key that
    submitted it, as auto-approve approves (its scopes and spend budget hold), at once. One
    that cannot be approved is never left waiting: it is cancelled unbilled, failure_code
    insufficient_credits (the balance or the key's budget does not cover the hold) or
    not_approved (the key may no longer spend on it), the reason naming the amount."""
    try:
        job_approve(job=job, actor=AUTO_APPROVE, spend_key=job.created_by_key)
    except PaymentRequired as error:
        job_finish(job=job, status=JobStatus.CANCELLED, actor=AUTO_APPROVE,
                   failure_code=FailureCode.INSUFFICIENT_CREDITS,
                   failure_reason=error.detail.removesuffix(" Top up and approve again."))
        return JobStatus.CANCELLED
    except DomainError as error:
        job_finish(job=job, status=JobStatus.CANCELLED, actor=AUTO_APPROVE,
                   failure_code=FailureCode.NOT_APPROVED, failure_reason=error.detail)
        return JobStatus.CANCELLED
    return JobStatus.IN_PROGRESS


def _approving_key_check(job: Job, key: ApiKey) -> None:
    """403 when `key` may not spend on this job: its model is outside the key's scopes (a
    key may approve only what it could have submitted), or, for the key an auto-approval
    acts for, the key was revoked or has expired since it submitted."""
    if not key.allows(job.model):
        raise Forbidden(f"This API key may not use model '{job.model}' (its model scopes "
                        f"are {', '.join(key.model_scopes)}), so it cannot approve this "
                        "job: approve it with a key scoped to that model.")
    if not key.is_active:
        raise Forbidden("The API key that submitted this job is no longer active, so the "
                        "job is not approved on its behalf: approve it with an active key.")


@transaction.atomic
def job_approve(*, job: Job, actor: Actor, spend_key: ApiKey | None = None) -> Job:
    """cost_ready -> in_progress, holding est_cost_cents in the same commit.

    The spend is the approving key's (actor.key), or `spend_key`'s when the system approves
    for a key (auto-approve, for the key that submitted): that key's scopes must include
    the job's model (403) and its spend budget must cover the estimate (402, in
    billing.services.hold_place). 409 from any other state (a retried approval included:
    it holds nothing twice), 402 when the balance does not cover the estimate.
    """
    key = actor.key or spend_key
    if key is not None:
        _approving_key_check(job, key)
    elif actor.user is not None and job.est_cost_cents is not None:
        # A person's approval in the console spends for no key, so no key budget holds it:
        # a member's spending limit does (402 past it; issue 40 L7). Under the organization
        # lock it takes, which job_transition takes again, first, as every spend does.
        member_spend_require(organization=job.organization, user=actor.user,
                             cents=job.est_cost_cents,
                             what="approving this job holds")
    if actor is not AUTO_APPROVE:
        # 503 before anything is held. Auto-approval runs on a worker that was just handed
        # its message: a broker lost since is left to the start's recovery lease.
        dispatch.broker_require()
    approved = job_transition(job=job, to=JobStatus.IN_PROGRESS, actor=actor,
                              approved_by_key=key, approved_by_user=actor.user)
    if approved is None:
        status = Job.objects.values_list("status", flat=True).get(pk=job.pk)
        raise Conflict(f"This job is {status}: only a job in cost_ready can be approved.")
    audit_record(organization=approved.organization, actor=actor,
                 action=AuditAction.JOB_APPROVED, target=approved,
                 data={"est_cost_cents": approved.est_cost_cents,
                       **({"api_key": key.display} if key is not None else {})})
    return approved


def job_auto_approve(*, job: Job) -> None:
    """The organization's auto-approve: the approval made as if the submitting key made
    the API call, so that key's scopes and spend budget hold (a budget cannot be walked
    around by letting the system approve). One that cannot be covered, or that the key may
    no longer make, leaves the job in cost_ready for a person to approve."""
    try:
        job_approve(job=job, actor=AUTO_APPROVE, spend_key=job.created_by_key)
    except DomainError as error:
        logger.info("auto-approve of job %s refused: %s", job.pk, type(error).__name__)


def job_cancellable(job: Job) -> bool:
    """Whether a cancel stops this job now (jobs.constants CANCELLABLE)."""
    return job.status in CANCELLABLE[job.data_residency]


@transaction.atomic
def job_cancel(*, job: Job, actor: Actor) -> Job:
    """The reference's cancel: immediate when no work is in flight, cancelling while rows
    run, 409 while estimating (except an EU job, which may wait an hour for a machine) and
    once finalizing or terminal. A repeat while cancelling changes nothing."""
    # The organization, then the job, then its chunks: a worker's claim of a pending chunk
    # waits for this decision instead of racing it.
    organization_lock(job.organization_id)
    locked = Job.objects.select_for_update().get(pk=job.pk)
    status = JobStatus(locked.status)
    if status == JobStatus.CANCELLING:
        return locked
    if locked.approve_at_estimate and status in (JobStatus.SUBMITTED, JobStatus.ESTIMATING):
        # No approval step to withhold: the cancel is kept, and the job stops unbilled
        # at cost_ready instead of being approved (job_cost_ready). A repeat changes nothing.
        if _cancel_request(locked):
            audit_record(organization=locked.organization, actor=actor,
                         action=AuditAction.JOB_CANCELLED, target=locked,
                         data={"from": status.value, "to": "cancel_requested"})
        return locked
    if not job_cancellable(locked):
        if status in (JobStatus.SUBMITTED, JobStatus.ESTIMATING):
            raise Conflict(f"This job is {status.value}: wait for cost_ready and simply never "
                           "approve it - estimates are free, and an unapproved job cancels "
                           "itself after 24 hours.")
        raise Conflict(f"This job is {status.value}: it is too late to cancel it.")
    chunk_states = set(locked.chunks.select_for_update().values_list("status", flat=True))
    if status == JobStatus.IN_PROGRESS and chunk_states & {ChunkStatus.RUNNING,
                                                           ChunkStatus.DONE}:
        # Rows are running: no new work starts, running rows finish, and the runner settles
        # the job as cancelled with the finished rows as a partial result. Its chunks never
        # sent (fair dispatch) are skipped now; with none in flight either, nothing would
        # end to finalize it, so that is sent.
        _cancel_request(locked)  # read when it settles: cancelled, not done
        moved = job_transition(job=locked, to=JobStatus.CANCELLING, actor=actor)
        chunks_skip_waiting(job_id=locked.pk)
        if not locked.chunks.filter(IN_FLIGHT).exists():
            job_finalize_send(job=locked)
    else:
        # No work in flight: it stops now, and any hold is released in full.
        chunks_skip_pending(job_id=locked.pk)
        moved = job_transition(job=locked, to=JobStatus.CANCELLED, actor=actor)
    assert moved is not None, "the job row is locked; its status cannot have moved"
    audit_record(organization=moved.organization, actor=actor,
                 action=AuditAction.JOB_CANCELLED, target=moved,
                 data={"from": status.value, "to": moved.status})
    return moved


def _cancel_request(job: Job) -> bool:
    """The one writer of Job.cancel_requested (job_cancel's, the job row locked): a cancel
    that reached the job while it could not stop at once - rows running (it settles as
    cancelled, jobs.services.running), or not yet priced where it is approved at its
    estimate (job_cost_ready stops it). Whether it was newly recorded; never cleared."""
    recorded = Job.objects.filter(pk=job.pk, cancel_requested=False).update(
        cancel_requested=True) == 1
    job.cancel_requested = True
    return recorded


def job_finish(*, job: Job, status: JobStatus, cost_cents: int = 0,
               failure_code: FailureCode | str = "", failure_reason: str = "",
               outcome: dict[str, Any] | None = None, actor: Actor = WORKER) -> Job:
    """Move a job to a terminal state, its hold settled on `cost_cents` in the same commit;
    `outcome` (row counts, the result, partial) is recorded in that same update.

    A job that cannot make that move (already terminal, say) is returned unchanged:
    finishing twice settles once.
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"{status} is not a terminal status")
    finished = job_transition(job=job, to=status, actor=actor, cost_cents=cost_cents,
                              failure_code=failure_code, failure_reason=failure_reason,
                              **(outcome or {}))
    return finished or Job.objects.get(pk=job.pk)


def job_fail(*, job: Job, code: FailureCode, reason: str, actor: Actor = WORKER) -> Job:
    """Fail a job, unbilled: invalid_input (the input cannot work) or internal_error."""
    return job_finish(job=job, status=JobStatus.FAILED, failure_code=code,
                      failure_reason=reason, actor=actor)
