"""The Jobs pages: the list, one job, a new job (browser upload, then submit), and the
job's actions, each the same service the API calls."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote
from uuid import UUID

from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from anex.api.errors import error_json_response
from anex.csp import csp_connect_add
from anex.errors import DomainError
from anex.regions import organization_region
from billing.selectors import job_money
from console.forms import JobSubmitForm
from console.selectors import console_models
from console.views.base import Console, console_page, fragment, page
from console.views.charts import cost_chart, outcomes_chart, rows_chart
from inference.catalog import model_get
from inference.constants import InputFormat
from inference.pricing import minimum_job_cents
from jobs.constants import TERMINAL_STATUSES, FailureCode, JobStatus, Priority
from jobs.models import Job
from jobs.selectors import Progress, job_get, job_list, job_models_used, job_progress_of
from jobs.serializers import JobOut
from jobs.services.data import job_data_delete, job_result_link
from jobs.services.inputs import input_create
from jobs.services.lifecycle import job_approve, job_cancel, job_cancellable
from jobs.services.metering import job_cost_so_far
from jobs.services.outcomes import job_error_rows, job_outcomes, job_timeline
from jobs.services.submission import job_submit
from jobs.storage import storage_for

PAGE_SIZE = 25
ERROR_ROWS_PAGE_SIZE = 50
# How often a page with a job in flight asks for its fresh state (one small GET).
POLL_MS = 2000
FAILURES = {
    FailureCode.INVALID_INPUT: "The input could not be run as it is, and nothing was charged.",
    FailureCode.INTERNAL_ERROR: "Something went wrong on our side.",
}
STATUS_WORDS = {
    JobStatus.SUBMITTED: "Submitted: the estimate starts in a moment.",
    JobStatus.ESTIMATING: "Estimating: checking every row and pricing the job.",
    JobStatus.COST_READY: "Estimate ready: approve it to run the job.",
    JobStatus.IN_PROGRESS: "Running.",
    JobStatus.FINALIZING: "Finalizing: writing the result file.",
    JobStatus.DONE: "Done.",
    JobStatus.FAILED: "Failed.",
    JobStatus.CANCELLING: "Cancelling: rows already running finish first.",
    JobStatus.CANCELLED: "Cancelled.",
}
TIER_WORDS = {
    Priority.FLEX: "Flex",
    Priority.STANDARD: "Standard",
    Priority.PRIORITY: "Priority",
}


def _live(jobs: list[Job]) -> bool:
    return any(job.status not in TERMINAL_STATUSES or
               (job.data_delete_requested and job.data_deleted_at is None) for job in jobs)


@require_GET
@console_page()
def job_list_page(request: HttpRequest, console: Console) -> HttpResponse:
    status = request.GET.get("status", "")
    model = request.GET.get("model", "")
    if status not in JobStatus.values:
        status = ""
    jobs = job_list(organization=console.organization, status=status, model=model)
    current = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [(job, job_progress_of(job=job))
            for job in current.object_list]
    context: dict[str, Any] = {
        "rows": rows, "page_obj": current, "status": status, "model": model,
        "statuses": JobStatus.values, "models": job_models_used(organization=console.organization),
        "live": _live([job for job, _ in rows]), "poll_ms": POLL_MS,
        "filtered": bool(status or model),
        # The pager keeps the filters (templates/console/_pager.html).
        "pager_query": "".join(f"{name}={quote(value)}&"
                               for name, value in (("status", status), ("model", model))
                               if value),
    }
    if request.GET.get("fragment"):
        return fragment(request, "console/jobs/_rows.html", context)
    return page(request, console, "console/jobs/list.html", "jobs", **context)


def _minimum_price(job: Job) -> int:
    model = model_get(job.model)
    return minimum_job_cents(model) if model is not None else 0


def _picture(job: Job, progress: Progress) -> dict[str, Any]:
    """The job as a picture (issue 44): its rows over time with the ETA, its rows by
    outcome and error, and its cost against its hold; nothing before approval, when no
    row has run and nothing is held."""
    if job.approved_at is None:
        return {}
    terminal = job.status in TERMINAL_STATUSES
    now = (job.finished_at or timezone.now()) if terminal else timezone.now()
    outcomes = job_outcomes(job=job)
    money = job_money(job_id=job.pk)
    return {
        "rows_chart": rows_chart(points=job_timeline(job=job, until=now), progress=progress,
                                 start=job.approved_at, now=now,
                                 running=job.status == JobStatus.IN_PROGRESS),
        "outcomes": outcomes_chart(outcomes),
        "cost_chart": cost_chart(cost_so_far=0 if money.settled else job_cost_so_far(job=job),
                                 money=money, minimum=_minimum_price(job)),
    }


def _job_context(console: Console, job: Job) -> dict[str, Any]:
    fields = JobOut(job).data
    progress = job_progress_of(job=job)
    return {
        "organization": console.organization,  # the live part's forms carry it
        "job": job, "fields": fields,
        "progress": progress,
        "tier": TIER_WORDS.get(Priority(job.priority), job.priority),
        "rows_readable": job.data_deleted_at is None and not job.data_delete_requested,
        **_picture(job, progress),
        "status_words": STATUS_WORDS.get(JobStatus(job.status), job.status),
        "failure_words": FAILURES.get(FailureCode(job.failure_code)) if job.failure_code else "",
        "can_approve": job.status == JobStatus.COST_READY,
        "can_cancel": job_cancellable(job),
        "can_delete": job.data_deleted_at is None and not job.data_delete_requested,
        "deleting": job.data_delete_requested and job.data_deleted_at is None,
        "can_download": (job.status in TERMINAL_STATUSES and bool(job.result_key)
                         and job.data_deleted_at is None),
        "terminal": job.status in TERMINAL_STATUSES,
        "live": _live([job]), "poll_ms": POLL_MS,
    }


@require_GET
@console_page()
def job_page(request: HttpRequest, console: Console, job_id: UUID) -> HttpResponse:
    job = job_get(organization=console.organization, id=job_id)
    context = _job_context(console, job)
    if request.GET.get("fragment"):
        return fragment(request, "console/jobs/_live.html", context)
    return page(request, console, "console/jobs/detail.html", "jobs", **context)


@require_GET
@console_page()
def job_error_rows_page(request: HttpRequest, console: Console, job_id: UUID) -> HttpResponse:
    """The rows of one of a job's errors (the outcome breakdown's link): custom_id and
    message, a page at a time, read from the job's chunk results. Once the job's data is
    deleted (or being deleted) there are none to read: the page says so, 410 as the API's
    result answers."""
    job = job_get(organization=console.organization, id=job_id)
    key = request.GET.get("code", "")
    if job.data_deleted_at is not None or job.data_delete_requested:
        response = page(request, console, "console/jobs/errors.html", "jobs", job=job,
                        key=key, deleted=True)
        response.status_code = 410
        return response
    rows = job_error_rows(job=job, key=key)
    if not key or not len(rows):
        raise Http404("This job has no rows with that error.")
    current = Paginator(rows, ERROR_ROWS_PAGE_SIZE).get_page(request.GET.get("page"))
    return page(request, console, "console/jobs/errors.html", "jobs", job=job, key=key,
                page_obj=current, code_query=quote(key))


@require_POST
@console_page()
def job_approve_action(request: HttpRequest, console: Console, job_id: UUID) -> HttpResponse:
    job = job_get(organization=console.organization, id=job_id)
    job_approve(job=job, actor=console.actor)
    return redirect("console-job", job_id=job.pk)


@require_POST
@console_page()
def job_cancel_action(request: HttpRequest, console: Console, job_id: UUID) -> HttpResponse:
    job = job_get(organization=console.organization, id=job_id)
    job_cancel(job=job, actor=console.actor)
    return redirect("console-job", job_id=job.pk)


@require_http_methods(["GET", "POST"])
@console_page()
def job_delete_data_action(request: HttpRequest, console: Console,
                           job_id: UUID) -> HttpResponse:
    job = job_get(organization=console.organization, id=job_id)
    if request.method == "GET":
        return page(request, console, "console/confirm.html", "jobs",
                    title="Delete this job's data?",
                    text=("The input file and the result are deleted now and cannot be "
                          "brought back; the job's record (statuses, counts, cost) stays. "
                          + ("The job is still running: it is cancelled first, and its "
                             "data goes once it has stopped." if job.status not in
                             TERMINAL_STATUSES else "")),
                    action=reverse("console-job-delete-data", args=[job.pk]),
                    button="Delete data", cancel=reverse("console-job", args=[job.pk]))
    job_data_delete(job=job, actor=console.actor)
    return redirect("console-job", job_id=job.pk)


@require_GET
@console_page()
def job_result_download(request: HttpRequest, console: Console, job_id: UUID) -> HttpResponse:
    job = job_get(organization=console.organization, id=job_id)
    return HttpResponseRedirect(str(job_result_link(job=job)["result_url"]))


@require_POST
@console_page()
def job_upload_target(request: HttpRequest, console: Console) -> HttpResponse:
    """A presigned upload target for the browser (the API's POST /inputs, upload mode):
    the file goes from the browser straight to storage."""
    organization = console.organization
    try:
        created = input_create(
            organization=organization, actor=console.actor,
            # The console is not a regional API host: it places the upload in the
            # organization's own region (docs/dev/decisions/2026-12-01-the-console.md).
            host_region=organization_region(organization),
            input_format=request.POST.get("format", InputFormat.JSONL))
    except DomainError as error:
        return error_json_response(error)
    return JsonResponse({"id": str(created.input.pk), **(created.target or {})})


@require_http_methods(["GET", "POST"])
@console_page()
def job_new_page(request: HttpRequest, console: Console) -> HttpResponse:
    form = JobSubmitForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        organization = console.organization
        try:
            job = job_submit(
                organization=organization, actor=console.actor, request=form.job_request(),
                # The console is not a regional API host: it acts in the organization's
                # own region, where its upload was just placed
                # (docs/dev/decisions/2026-12-01-the-console.md, "Region").
                host_region=organization_region(organization))
        except DomainError as error:
            if error.status == 404:
                form.add_error(None, "That upload is not one of this organization's. "
                                     "Pick the file again.")
            else:
                form.add_error(None, error.detail)
        except ValidationError as error:
            form.add_error(None, error)
        else:
            return redirect("console-job", job_id=job.pk)
    response = page(request, console, "console/jobs/new.html", "jobs", form=form,
                    models=console_models())
    # The page's script sends the file straight to the region's storage.
    return csp_connect_add(response, [
        storage_for(organization_region(console.organization)).upload_origin()])
