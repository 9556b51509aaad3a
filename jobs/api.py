"""The batch API's views (/batch/v1): thin, one per operation (STYLE.md rule 7)."""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from anex.api.authentication import request_actor, request_organization
from anex.api.errors import ApiError
from anex.regions import region_require, request_region, residency_resolve
from billing.services import credits_require_positive
from inference.constants import InputFormat
from jobs.idempotency import IDEMPOTENCY_PARAMETER, IN_FLIGHT_DESCRIPTION, idempotent
from jobs.models import Job
from jobs.selectors import check_get, input_get, job_get, job_progress
from jobs.serializers import (
    CHECK_OUT_SCHEMA,
    CHECK_STATE_SCHEMA,
    INPUT_INGEST_SCHEMA,
    INPUT_UPLOAD_SCHEMA,
    JOB_STATE_SCHEMA,
    RERUN_SCHEMA,
    CheckOut,
    InputCreateIn,
    InputOut,
    JobCreateIn,
    JobOut,
    RerunIn,
    utc_iso,
    utc_offset_iso,
)
from jobs.services.checks import check_create
from jobs.services.data import STOPPING, job_data_delete, job_result_link
from jobs.services.inputs import input_ingest_create, input_refresh, input_upload_create
from jobs.services.lifecycle import job_approve, job_cancel
from jobs.services.rerun import DEFAULT_INCLUDE, job_rerun, job_result_merged_link
from jobs.services.submission import JobRequest, job_submit

ERRORS = {status: OpenApiResponse(description=text) for status, text in {
    400: "Validation failed", 401: "Invalid or inactive key", 402: "No credits",
    403: "EU data routing not enabled, or a key outside the model's scopes",
    404: "Unknown id", 413: "Request body or ingest source over its cap",
    421: "Data kept in the other region", 422: "Malformed request", 429: "Rate limited",
    503: "A dependency could not be checked"}.items()}


def _https(name: str, url: str) -> str:
    try:
        parts = urlsplit(url)
        valid = parts.scheme == "https" and bool(parts.hostname)
    except ValueError:  # urlsplit refuses an unbalanced or invalid [IPv6] host
        valid = False
    if not valid:
        raise ApiError(400, f"{name} must be an https:// URL.")
    return url


class InputsView(APIView):
    @extend_schema(
        operation_id="createInput", request=InputCreateIn, parameters=[IDEMPOTENCY_PARAMETER],
        responses={200: {"oneOf": [INPUT_UPLOAD_SCHEMA, INPUT_INGEST_SCHEMA]},
                   409: OpenApiResponse(description=f"Not answered yet: {IN_FLIGHT_DESCRIPTION}"),
                   **ERRORS},
        summary="Ingest an input from a URL, or get a presigned target to upload one",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        body = InputCreateIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        source_url, callback_url = data.get("source_url"), data.get("callback_url")
        raw_format = data.get("format")
        if raw_format is not None and raw_format not in InputFormat.values:
            raise ApiError(400, "format must be jsonl or parquet.")
        fmt = InputFormat(raw_format) if raw_format else None
        if source_url is None:
            if fmt is None:
                raise ApiError(400, "format is required for a direct upload (jsonl or "
                                    "parquet); to ingest from a URL, give source_url.")
            if callback_url is not None:
                raise ApiError(400, "callback_url is not available for a direct upload: "
                                    "there is no server-side copy to report on.")
        else:
            _https("source_url", source_url)
            if callback_url is not None:
                _https("callback_url", callback_url)
        organization = request_organization(request)
        residency = residency_resolve(organization=organization,
                                      requested=data.get("data_residency"))
        region_require(request, residency=residency, noun="input")
        # Before an upload target is minted or a source URL is contacted.
        credits_require_positive(organization=organization)
        actor = request_actor(request)
        if source_url is None:
            assert fmt is not None
            item, target = input_upload_create(organization=organization, actor=actor,
                                               fmt=fmt, residency=residency)
            return Response({
                "id": str(item.pk), "status": item.status, **target,
                "expires_at": utc_iso(item.upload_expires_at), "input_s3_uri": item.input_s3_uri,
            })
        item, secret = input_ingest_create(organization=organization, actor=actor,
                                           source_url=source_url, fmt=fmt,
                                           callback_url=callback_url, residency=residency)
        out = {"id": str(item.pk), "status": item.status, "input_s3_uri": item.input_s3_uri}
        if secret is not None:
            out["callback_secret"] = secret
        return Response(out)


class InputView(APIView):
    @extend_schema(operation_id="getInput", responses={200: InputOut, **ERRORS},
                   summary="Check an input's status until it is ready")
    def get(self, request: Request, input_id: str) -> Response:
        item = input_get(organization=request_organization(request), id=input_id)
        region_require(request, residency=item.data_residency, noun="input")
        return Response(InputOut(input_refresh(item=item)).data)


class JobsView(APIView):
    @extend_schema(operation_id="submitJob", request=JobCreateIn,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={200: JOB_STATE_SCHEMA, 409: OpenApiResponse(
                       description=f"Input not ready yet, or {IN_FLIGHT_DESCRIPTION}"),
                       410: OpenApiResponse(description="Input expired: its file is deleted"),
                       **ERRORS},
                   summary="Submit a job: an input plus a model")
    @idempotent
    def post(self, request: Request) -> Response:
        job = job_submit(
            organization=request_organization(request), actor=request_actor(request),
            host_region=request_region(request), request=_job_request(request))
        return _state(job)


def _job_request(request: Request) -> JobRequest:
    """A submit's body (POST /jobs, and POST /checks, which takes the same fields)."""
    body = JobCreateIn(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    return JobRequest(
        model=data["model"], input_id=data.get("input_id"),
        input_s3_uri=data.get("input_s3_uri"),
        max_output_tokens=data.get("max_output_tokens") or data.get("max_tokens"),
        max_tokens_alias=data.get("max_output_tokens") is None
        and data.get("max_tokens") is not None,
        reasoning=data.get("reasoning"), reasoning_budget=data.get("reasoning_budget"),
        reasoning_effort=data.get("reasoning_effort"), video_fps=data.get("video_fps"),
        response_format=data.get("response_format"), dimensions=data.get("dimensions"),
        data_residency=data.get("data_residency"),
    )


def _state(job: Job) -> Response:
    """The reference's answer to submit, approve and cancel: the id and the new status."""
    return Response({"id": str(job.pk), "status": job.status})


class JobView(APIView):
    @extend_schema(operation_id="getJob", responses={200: JobOut, **ERRORS},
                   summary="Poll a job for its status, estimate, and row counts")
    def get(self, request: Request, job_id: str) -> Response:
        # Either region's API answers this poll (the reference).
        job = job_get(organization=request_organization(request), id=job_id)
        return Response(JobOut(job).data)


class JobApproveView(APIView):
    @extend_schema(operation_id="approveJob", request=None,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={200: JOB_STATE_SCHEMA, 409: OpenApiResponse(
                       description=f"Not awaiting approval, or {IN_FLIGHT_DESCRIPTION}"),
                       **ERRORS},
                   summary="Approve the estimate: holds est_cost_cents and starts the job")
    @idempotent
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        return _state(job_approve(job=job, actor=request_actor(request)))


class JobCancelView(APIView):
    @extend_schema(operation_id="cancelJob", request=None,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={200: JOB_STATE_SCHEMA, 409: OpenApiResponse(
                       description="Too late to cancel, or still estimating, or "
                                   f"{IN_FLIGHT_DESCRIPTION}"), **ERRORS},
                   summary="Cancel a job")
    @idempotent
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        return _state(job_cancel(job=job, actor=request_actor(request)))


PROGRESS_SCHEMA = {
    "type": "object",
    "required": ["done_rows", "total_rows", "eta_seconds", "rows_per_second"],
    "properties": {
        "done_rows": {"type": "integer", "description": "Rows whose answer (or row error) "
                      "is in; they arrive a chunk at a time."},
        "total_rows": {"type": ["integer", "null"],
                       "description": "The input's rows; null until the input is counted."},
        "eta_seconds": {"type": ["integer", "null"],
                        "description": "Seconds until the remaining rows are done at the "
                                       "rate so far; 0 when none remain; null when unknown."},
        "rows_per_second": {"type": ["number", "null"],
                            "description": "Rows done per second since approval; null "
                                           "before the first rows are done."},
    },
}


class JobProgressView(APIView):
    @extend_schema(operation_id="getJobProgress", responses={200: PROGRESS_SCHEMA, **ERRORS},
                   summary="How far a running job has come: rows done, rate and ETA")
    def get(self, request: Request, job_id: str) -> Response:
        # Like the job poll, either region's API answers it: it carries counts, no data.
        progress = job_progress(organization=request_organization(request), id=job_id)
        return Response(dataclasses.asdict(progress))


RESULT_SCHEMA = {
    "type": "object",
    "required": ["id", "status", "result_url", "expires_in", "partial", "row_count"],
    "properties": {"id": {"type": "string", "format": "uuid"}, "status": {"type": "string"},
                   "result_url": {"type": "string", "format": "uri"},
                   "expires_in": {"type": "integer"}, "partial": {"type": "boolean"},
                   "row_count": {"type": "integer"},
                   "merged": {"type": "boolean",
                              "description": "Only with ?merged=true: the file merges the "
                                             "job's re-runs."}},
}
DATA_DELETED_SCHEMA = {
    "type": "object",
    "required": ["id", "status", "data_deleted_at"],
    "properties": {"id": {"type": "string", "format": "uuid"}, "status": {"type": "string"},
                   "data_deleted_at": {"type": ["string", "null"], "format": "date-time"},
                   "message": {"type": "string"}},
}


MERGED_PARAMETER = OpenApiParameter(
    "merged", OpenApiTypes.BOOL, OpenApiParameter.QUERY, required=False,
    description="true: one file with each row's latest outcome, the rows that re-runs "
                "(POST /jobs/{id}/rerun) ran again taken from the latest re-run that "
                "delivered them.")


class JobResultView(APIView):
    @extend_schema(operation_id="getJobResult", parameters=[MERGED_PARAMETER],
                   responses={200: RESULT_SCHEMA,
                              409: OpenApiResponse(description="No result to deliver"),
                              410: OpenApiResponse(description="Result data deleted"),
                              **ERRORS},
                   summary="Download the result file: a presigned link")
    def get(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        region_require(request, residency=job.data_residency, noun="job")
        merged = request.query_params.get("merged", "false").lower()
        if merged not in ("true", "false"):
            raise ApiError(422, "merged must be true or false.")
        if merged == "true":
            return Response(job_result_merged_link(job=job))
        return Response(job_result_link(job=job))


class JobRerunView(APIView):
    @extend_schema(operation_id="rerunJob", request=RerunIn,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={200: RERUN_SCHEMA, 409: OpenApiResponse(
                       description="Not finished, no rows with those outcomes, or "
                                   f"{IN_FLIGHT_DESCRIPTION}"),
                       410: OpenApiResponse(description="The job's data or input is gone"),
                       **ERRORS},
                   summary="Run a finished job's failed rows again, as a new (child) job")
    @idempotent
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        body = RerunIn(data=request.data or {})
        body.is_valid(raise_exception=True)
        include = body.validated_data.get("include") or DEFAULT_INCLUDE
        child, rows = job_rerun(job=job, actor=request_actor(request), include=include,
                                host_region=request_region(request))
        return Response({"id": str(child.pk), "status": child.status,
                         "parent_id": str(job.pk), "row_count": rows})


class ChecksView(APIView):
    @extend_schema(operation_id="createCheck", request=JobCreateIn,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={202: CHECK_STATE_SCHEMA, 409: OpenApiResponse(
                       description=f"Input not ready yet, or {IN_FLIGHT_DESCRIPTION}"),
                       410: OpenApiResponse(description="Input expired: its file is deleted"),
                       **ERRORS},
                   summary="Check an input's rows for a model without running them (free)")
    @idempotent
    def post(self, request: Request) -> Response:
        check = check_create(organization=request_organization(request),
                             actor=request_actor(request),
                             host_region=request_region(request), request=_job_request(request))
        return Response({"id": str(check.pk), "status": check.status}, status=202)


class CheckView(APIView):
    @extend_schema(operation_id="getCheck",
                   responses={200: CHECK_OUT_SCHEMA, **ERRORS},
                   summary="A preflight check's outcome: every failing row, up to 1,000")
    def get(self, request: Request, check_id: str) -> Response:
        check = check_get(organization=request_organization(request), id=check_id)
        # Its errors quote the rows: read only where the input's data is kept.
        region_require(request, residency=check.input.data_residency, noun="check")
        return Response(CheckOut(check).data)


class JobDataView(APIView):
    @extend_schema(operation_id="deleteJobData", request=None,
                   responses={200: DATA_DELETED_SCHEMA, 202: DATA_DELETED_SCHEMA, **ERRORS},
                   summary="Delete a job's data now (a job in flight is cancelled first)")
    def delete(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        job, gone = job_data_delete(job=job, actor=request_actor(request))
        body: dict[str, object] = {"id": str(job.pk), "status": job.status,
                                   "data_deleted_at": utc_offset_iso(job.data_deleted_at)}
        if not gone:
            body["message"] = STOPPING
        return Response(body, status=200 if gone else 202)
