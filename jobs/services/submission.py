"""POST /jobs: every check the reference makes before a job exists, then the job.

"Format, size, and the shape of response_format are checked before the job exists; a
failure there returns an error and creates nothing." The input itself is never read here:
its rows are checked while the job is estimating (jobs.services.estimation).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from anex.errors import Conflict, Gone, Invalid, Malformed, NotFound, RateLimited
from anex.regions import Region, region_check, residency_resolve
from billing.services import credits_require_positive, organization_lock
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction
from console.models import Organization
from console.selectors import model_for_key
from inference.catalog import CatalogModel
from inference.kinds import AnyKind, kind_for
from inference.response_format import response_format_problem
from inference.rows.core import JobOptions
from jobs import dispatch
from jobs.constants import AWAITING_APPROVAL_STATUSES, InputStatus, Priority, TaskType
from jobs.models import Input, Job
from jobs.selectors import input_get
from jobs.services.estimation import needs_sample
from jobs.services.inputs import input_refresh
from jobs.services.lifecycle import job_created
from jobs.services.sampling import sample_allowance_require

APPROVAL_QUEUE_LIMIT = 10
APPROVAL_QUEUE_RETRY_AFTER = 60


@dataclass(frozen=True)
class JobRequest:
    """A submit (or preflight check) after its shape was checked: the job's options and
    where its input is."""

    options: JobOptions
    input_id: str | None = None
    input_s3_uri: str | None = None
    data_residency: str | None = None
    # The urgency tier (jobs.constants.Priority); standard, the reference's, by default.
    priority: str = Priority.STANDARD


def _input_for(request: JobRequest, organization: Organization) -> Input:
    if request.input_id is not None:
        return input_get(organization=organization, id=request.input_id)
    item = Input.objects.for_org(organization).filter(input_s3_uri=request.input_s3_uri).first()
    if item is None:
        raise NotFound.of("Input")
    return item


def _require_ready(item: Input) -> None:
    """409 for an input that is not ready yet (the reference's 409); 400 for one that
    failed, which never becomes ready: its file is not the format it claims, empty or over
    the cap, or its copy failed (the reference's 400: "a file that is not JSONL"); 410 for
    one that expired (the reference: "a submit against it is refused - create a new input
    instead"): its file is deleted, as a purged result's is
    (docs/dev/decisions/2026-12-01-inputs-and-results.md)."""
    if item.status == InputStatus.READY:
        return
    if item.status == InputStatus.FAILED:
        why = item.error.rstrip(".") or "it could not be stored"
        raise Invalid(f"The input failed - {why[:1].lower()}{why[1:]}. Create a new input.")
    if item.status in (InputStatus.AWAITING_UPLOAD, InputStatus.PENDING,
                       InputStatus.COPYING):
        raise Conflict(f"The input is {item.status}, not ready: wait for it to be ready, "
                       "then submit.")
    raise Gone("The input has expired and its file is deleted (an upload is kept 7 days, an "
               "upload window open about an hour): create a new input.")


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check made before a job exists."""

    model: CatalogModel
    kind: AnyKind
    residency: Region
    input: Input


def job_request_admit(*, organization: Organization, actor: Actor, request: JobRequest,
                      host_region: Region) -> Admitted:
    """Every check the reference makes before a job exists, in its order: the model and
    its field rules (422), response_format's shape (400), residency (403) and the host
    (421), credits (402), then the input (404, 422, 409, 400, 410). Submit and a preflight
    check (POST /checks) both pass through it, so they answer alike."""
    options = request.options
    model = model_for_key(options.model, actor.key)
    kind = kind_for(model)
    # The reference's per-model-type acceptance rules for the job-level fields.
    problem = kind.fields_problem(model, options)
    if problem:
        raise Malformed(problem)
    if options.response_format is not None:
        problem = response_format_problem(options.response_format)
        if problem:
            raise Invalid(problem)
    residency = residency_resolve(organization=organization, requested=request.data_residency)
    region_check(host_region=host_region, residency=residency, noun="job")
    # The reference: "A credit balance of zero or below answers 402, before any of your
    # input is read and before a job is ever priced". Only the request itself (auth, body
    # shape, model and field rules, residency and host) is judged before it.
    credits_require_positive(organization=organization)
    item = _input_for(request, organization)
    if item.data_residency != residency:
        raise Malformed(
            f"The input is stored in the {item.data_residency} region and the job asks for "
            f"{residency.value}: a job's data_residency must match its input's.")
    if item.format not in kind.input_formats:
        raise Malformed(f"'{model.id}' takes JSONL input only; this input is "
                        f"{item.format}.")
    # Submission settles an upload's readiness itself (no separate poll needed).
    item = input_refresh(item=item)
    _require_ready(item)
    return Admitted(model=model, kind=kind, residency=residency, input=item)


def job_submit(*, organization: Organization, actor: Actor, request: JobRequest,
               host_region: Region, parent: Job | None = None,
               rerun_include: list[str] | None = None, approve_at_estimate: bool = False,
               collect_row_errors: bool = False) -> Job:
    """Create a job from a checked request, in `submitted`; estimating starts after commit.

    host_region is the region of the API host the request reached (421 if it is not the
    job's). A re-run (jobs.services.rerun) names its `parent` and the outcomes it picked,
    and is admitted against the parent's input: its own input is derived from the parent's
    rows by a worker (job_rerun_input_task), which then sends the estimate, so the request
    reads none of them. `approve_at_estimate` and `collect_row_errors` are the job's policy
    (Job: no approval step; every failing row kept), the caller's to choose: the OpenAI
    surface's batches take both.
    """
    admitted = job_request_admit(organization=organization, actor=actor, request=request,
                                 host_region=host_region)
    dispatch.broker_require()  # 503 before anything is written
    model, kind, residency, item = (admitted.model, admitted.kind, admitted.residency,
                                    admitted.input)
    with transaction.atomic():
        # Counted under the organization lock, so concurrent submits cannot overshoot.
        organization_lock(organization.pk)
        waiting = Job.objects.for_org(organization).filter(
            status__in=AWAITING_APPROVAL_STATUSES).count()
        if waiting >= APPROVAL_QUEUE_LIMIT:
            raise RateLimited(
                f"Too many jobs awaiting approval: this organization already has {waiting} in "
                f"its approval queue (the limit is {APPROVAL_QUEUE_LIMIT}). Approve or cancel "
                "some, or let them expire, then resubmit.",
                retry_after=APPROVAL_QUEUE_RETRY_AFTER)
        job = Job.objects.create(
            organization=organization, input=item if parent is None else None,
            task_type=TaskType(kind.task), format=item.format, data_residency=residency,
            created_by_key=actor.key, parent=parent, rerun_include=rerun_include,
            priority=Priority(request.priority),
            approve_at_estimate=approve_at_estimate, collect_row_errors=collect_row_errors,
            **Job.options_columns(request.options, generates=kind.generates))
        if needs_sample(job, model):
            # A sample is free work on the paid workers: none past the organization's
            # hourly allowance (429 here, the job rolled back with it).
            sample_allowance_require(organization_id=organization.pk)
        job_created(job=job, actor=actor)
        audit_record(organization=organization, actor=actor, action=AuditAction.JOB_SUBMITTED,
                     target=job, data={"model": model.id, "input": str(item.pk)})
        dispatch.send_on_commit(
            "job_estimate_task" if parent is None else "job_rerun_input_task", str(job.pk))
    return job

