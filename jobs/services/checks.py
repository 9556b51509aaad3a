"""Preflight checks (POST /checks, GET /checks/{id}): an input's rows checked for a model
and a job's fields exactly as a job's estimate checks them, except that every failing row
is reported (up to CHECK_ERRORS_MAX) rather than the first.

A check is free: it creates no job, takes no slot in the approval queue and holds no
credits. It is admitted by the submit's own checks (jobs.services.submission
job_request_admit: the same 402, 403, 421, 422 and input answers), and each organization
may start ANEX_CHECKS_PER_MINUTE of them a minute and have ANEX_CHECKS_IN_FLIGHT of them
reading at once, since reading and tokenizing a whole input is real work. The rows are
read by the check_run_task actor, on its own queue below the estimates (jobs.dispatch
CHECKS), so free checks never hold up the estimates of jobs that will be paid for.
"""

from __future__ import annotations

import logging
import math
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from anex.errors import RateLimited
from anex.logsafe import exception_summary
from anex.redis import window_hit
from anex.regions import Region
from billing.services import organization_lock
from console.actors import Actor
from console.models import Organization
from inference.catalog import model_get
from inference.rows.core import InputRejected, JobOptions
from jobs import dispatch
from jobs.constants import CHECK_ERRORS_MAX, CheckStatus
from jobs.models import PreflightCheck
from jobs.services.estimation import CANNOT_PRICE, input_check
from jobs.services.inputs import INPUT_CHANGED
from jobs.services.submission import JobRequest, job_request_admit
from jobs.storage import StorageChanged
from jobs.validation import RowError, RowErrors

logger = logging.getLogger(__name__)

CHECK_FAILED_INTERNALLY = ("The check could not be completed (an internal error, not your "
                           "file): run it again.")
# A check still reading after this was lost (its worker died, or its message): past the
# check_run_task time limit (jobs.tasks ESTIMATE_TIME_LIMIT_MS), so no live worker has it.
CHECK_STALE = timedelta(minutes=35)
RATE_LIMITED = ("Too many preflight checks: this organization may start {limit} a minute. "
                "Wait the seconds in the Retry-After header, then retry.")
IN_FLIGHT = ("Too many preflight checks in flight: this organization already has {count} "
             "still checking (the limit is {limit}). Wait for one to finish (GET "
             "/checks/{{id}}), then retry.")
# What an in-flight refusal's Retry-After says: a check of a typical input reads in seconds.
IN_FLIGHT_RETRY_AFTER = 10


def _rate_limit(organization: Organization) -> None:
    """429 past ANEX_CHECKS_PER_MINUTE checks this minute (the reference's rate-limit
    answer: Retry-After and error.code rate_limit_exceeded)."""
    limit = settings.ANEX_CHECKS_PER_MINUTE
    hit = window_hit("checks", organization.pk, fail="closed")
    if hit is None or hit.count <= limit:
        return
    detail = RATE_LIMITED.format(limit=limit)
    raise RateLimited(detail, retry_after=max(1, math.ceil(hit.seconds_left)),
                      code="rate_limit_exceeded")


def check_create(*, organization: Organization, actor: Actor, request: JobRequest,
                 host_region: Region) -> PreflightCheck:
    """Admit the request as a submit would, record the check, and read its rows after
    commit."""
    _rate_limit(organization)
    admitted = job_request_admit(organization=organization, actor=actor, request=request,
                                 host_region=host_region)
    with transaction.atomic():
        # Counted under the organization lock, so concurrent requests cannot overshoot.
        organization_lock(organization.pk)
        checking = PreflightCheck.objects.for_org(organization).filter(
            status=CheckStatus.CHECKING).count()
        limit = settings.ANEX_CHECKS_IN_FLIGHT
        if checking >= limit:
            raise RateLimited(IN_FLIGHT.format(count=checking, limit=limit),
                              retry_after=IN_FLIGHT_RETRY_AFTER, code="rate_limit_exceeded")
        check = PreflightCheck.objects.create(
            organization=organization, input=admitted.input, created_by_key=actor.key,
            model=admitted.model.id, options=request.options.to_json())
        dispatch.send_on_commit("check_run_task", str(check.pk))
    return check


def check_run(*, check_id: uuid.UUID | str) -> CheckStatus | None:
    """The check_run_task actor's work: read every row once and record the outcome. A
    check already settled is left alone (a redelivered message)."""
    check = PreflightCheck.objects.select_related("input").get(pk=check_id)
    if check.status != CheckStatus.CHECKING:
        return None
    errors = RowErrors(CHECK_ERRORS_MAX)
    rows: int | None = None
    tokens: int | None = None
    try:
        model = model_get(check.model)
        if model is None:
            errors.add(RowError(CANNOT_PRICE), row=False)
        else:
            options = JobOptions.from_json(check.model, check.options)
            checked = input_check(item=check.input, options=options, errors=errors)
            rows = checked.report.rows + errors.failed_rows
            if not checked.counted:
                errors.add(RowError(CANNOT_PRICE), row=False)
            else:
                tokens = checked.report.usage.all_input_tokens
    except InputRejected as rejected:  # a fault of the whole file: no rows, not parquet
        errors.add(RowError(rejected.message), row=False)
    except StorageChanged:
        errors.add(RowError(INPUT_CHANGED), row=False)
    except Exception as error:
        # Without the message or a traceback's: the rows being read may be quoted in them
        # (anex.logsafe, docs/dev/decisions/2026-12-02-row-text-out-of-the-logs.md).
        logger.error("preflight check %s failed: %s", check.pk, exception_summary(error))
        errors.add(RowError(CHECK_FAILED_INTERNALLY), row=False)
    status = CheckStatus.FAILED if errors.count else CheckStatus.PASSED
    settled = PreflightCheck.objects.filter(pk=check.pk, status=CheckStatus.CHECKING).update(
        status=status, row_count=rows, est_input_tok=tokens, error_count=errors.count,
        errors=[error.as_json() for error in errors.items], finished_at=timezone.now())
    return status if settled == 1 else None


def checks_settle_stale() -> int:
    """Fail the checks whose read was lost, so none stays `checking`: a check is free, and
    running it again is the fix (the periodic clock, every 10 minutes)."""
    now = timezone.now()
    return PreflightCheck.objects.filter(
        status=CheckStatus.CHECKING, created_at__lt=now - CHECK_STALE).update(
        status=CheckStatus.FAILED, error_count=1,
        errors=[RowError(CHECK_FAILED_INTERNALLY).as_json()], finished_at=now)
