"""The batch API's views (/batch/v1): thin, one per operation (docs/dev/style.md rule 7)."""

from __future__ import annotations

from collections.abc import Iterable

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from anex.api.authentication import request_actor, request_organization
from anex.api.errors import ApiError
from anex.api.schema import links
from anex.api.serializers import ErrorOut
from anex.regions import region_require, request_region
from jobs.constants import Priority
from jobs.idempotency import IDEMPOTENCY_PARAMETER, IN_FLIGHT_DESCRIPTION, idempotent
from jobs.selectors import check_get, input_get, job_get, job_progress, job_read
from jobs.serializers import (
    CheckOut,
    CheckStateOut,
    InputCreateIn,
    InputIngestOut,
    InputOut,
    InputUploadOut,
    JobCreateIn,
    JobDataDeletedOut,
    JobOut,
    JobResultOut,
    JobStateOut,
    ProgressOut,
    RerunIn,
    RerunOut,
)
from jobs.services.checks import check_create
from jobs.services.data import NOTHING_DELIVERED, STOPPING, job_data_delete, job_result_link
from jobs.services.inputs import input_create, input_refresh
from jobs.services.lifecycle import job_approve, job_cancel
from jobs.services.pages import NO_ROW_YET, ROWS_LIMIT_DEFAULT, ROWS_LIMIT_MAX, job_rows_page
from jobs.services.rerun import DEFAULT_INCLUDE, job_rerun, job_result_merged_link
from jobs.services.submission import JobRequest, job_submit

ERRORS = {status: OpenApiResponse(ErrorOut, description=text) for status, text in {
    400: "Validation failed", 401: "Invalid or inactive key", 402: "No credits",
    403: "EU data routing not enabled, or a key outside the model's scopes",
    404: "Unknown id", 413: "Request body or ingest source over its cap",
    421: "Data kept in the other region", 422: "Malformed request", 429: "Rate limited",
    503: "A dependency could not be checked"}.items()}


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorOut, description=description)


def _id(name: str, noun: str) -> OpenApiParameter:
    return OpenApiParameter(name, OpenApiTypes.UUID, OpenApiParameter.PATH,
                            description=f"The {noun}'s id.")


INPUT_ID, JOB_ID, CHECK_ID = _id("input_id", "input"), _id("job_id", "job"), \
    _id("check_id", "preflight check")
# The operations that take a job's id: what a submit or a re-run links to.
JOB_OPERATIONS = ("getJob", "getJobProgress", "getJobResult", "getJobRows", "approveJob",
                  "cancelJob", "rerunJob", "deleteJobData")


class InputsView(APIView):
    @extend_schema(
        operation_id="createInput", request=InputCreateIn, parameters=[IDEMPOTENCY_PARAMETER],
        responses={200: PolymorphicProxySerializer(
                       component_name="InputCreated", serializers=[InputUploadOut,
                                                                   InputIngestOut],
                       resource_type_field_name=None),
                   409: _error(f"Not answered yet: {IN_FLIGHT_DESCRIPTION}"),
                   **ERRORS},
        extensions=links(200, "input_id", ("getInput",)),
        summary="Ingest an input from a URL, or get a presigned target to upload one",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        body = InputCreateIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        created = input_create(
            organization=request_organization(request), actor=request_actor(request),
            host_region=request_region(request), input_format=data.get("format"),
            source_url=data.get("source_url"), callback_url=data.get("callback_url"),
            data_residency=data.get("data_residency"))
        if created.target is not None:
            return Response(InputUploadOut({"input": created.input,
                                            "target": created.target}).data)
        out: dict[str, object] = {"input": created.input}
        if created.callback_secret is not None:
            out["callback_secret"] = created.callback_secret
        return Response(InputIngestOut(out).data)


class InputView(APIView):
    @extend_schema(operation_id="getInput", parameters=[INPUT_ID],
                   responses={200: InputOut, **ERRORS},
                   summary="Check an input's status until it is ready")
    def get(self, request: Request, input_id: str) -> Response:
        item = input_get(organization=request_organization(request), id=input_id)
        region_require(request, residency=item.data_residency, noun="input")
        return Response(InputOut(input_refresh(item=item)).data)


class JobsView(APIView):
    @extend_schema(operation_id="submitJob", request=JobCreateIn,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={200: JobStateOut, 409: _error(
                       f"Input not ready yet, or {IN_FLIGHT_DESCRIPTION}"),
                       410: _error("Input expired: its file is deleted"),
                       **ERRORS},
                   extensions=links(200, "job_id", JOB_OPERATIONS),
                   summary="Submit a job: an input plus a model")
    @idempotent
    def post(self, request: Request) -> Response:
        job = job_submit(
            organization=request_organization(request), actor=request_actor(request),
            host_region=request_region(request), request=_job_request(request))
        return Response(JobStateOut(job).data)


def _job_request(request: Request) -> JobRequest:
    """A submit's body (POST /jobs, and POST /checks, which takes the same fields)."""
    body = JobCreateIn(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    return JobRequest(options=body.options(), input_id=data.get("input_id"),
                      input_s3_uri=data.get("input_s3_uri"),
                      data_residency=data.get("data_residency"),
                      priority=data.get("priority") or Priority.STANDARD)


class JobView(APIView):
    @extend_schema(operation_id="getJob", parameters=[JOB_ID],
                   responses={200: JobOut, **ERRORS},
                   summary="Poll a job for its status, estimate, and row counts")
    def get(self, request: Request, job_id: str) -> Response:
        # Either region's API answers this poll (the reference).
        job = job_read(organization=request_organization(request), id=job_id)
        return Response(JobOut.answer(job))


class JobApproveView(APIView):
    @extend_schema(operation_id="approveJob", request=None,
                   parameters=[JOB_ID, IDEMPOTENCY_PARAMETER],
                   responses={200: JobStateOut, 409: _error(
                       f"Not awaiting approval, or {IN_FLIGHT_DESCRIPTION}"),
                       **ERRORS},
                   summary="Approve the estimate: holds est_cost_cents and starts the job")
    @idempotent
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        return Response(JobStateOut(job_approve(job=job, actor=request_actor(request))).data)


class JobCancelView(APIView):
    @extend_schema(operation_id="cancelJob", request=None,
                   parameters=[JOB_ID, IDEMPOTENCY_PARAMETER],
                   responses={200: JobStateOut, 409: _error(
                       "Too late to cancel, or still estimating, or "
                       f"{IN_FLIGHT_DESCRIPTION}"), **ERRORS},
                   summary="Cancel a job")
    @idempotent
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        return Response(JobStateOut(job_cancel(job=job, actor=request_actor(request))).data)


class JobProgressView(APIView):
    @extend_schema(operation_id="getJobProgress", parameters=[JOB_ID],
                   responses={200: ProgressOut, **ERRORS},
                   summary="How far a running job has come: rows done, rate and ETA")
    def get(self, request: Request, job_id: str) -> Response:
        # Like the job poll, either region's API answers it: it carries counts, no data.
        progress = job_progress(organization=request_organization(request), id=job_id)
        return Response(ProgressOut.answer(progress))


MERGED_PARAMETER = OpenApiParameter(
    "merged", OpenApiTypes.BOOL, OpenApiParameter.QUERY, required=False,
    description="true: one file with each row's latest outcome, the rows that re-runs "
                "(POST /jobs/{id}/rerun) ran again taken from the latest re-run that "
                "delivered them.")


class JobResultView(APIView):
    @extend_schema(operation_id="getJobResult", parameters=[JOB_ID, MERGED_PARAMETER],
                   responses={200: JobResultOut,
                              409: _error("No result to deliver"),
                              410: _error("Result data deleted"),
                              **ERRORS},
                   summary="Download the result file: a presigned link")
    def get(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        region_require(request, residency=job.data_residency, noun="job")
        merged = request.query_params.get("merged", "false").lower()
        if merged not in ("true", "false"):
            raise ApiError(422, "merged must be true or false.")
        if merged == "true":
            return Response(JobResultOut(job_result_merged_link(job=job)).data)
        return Response(JobResultOut(job_result_link(job=job)).data)


# The largest cursor taken (PostgreSQL's bigint: a row index is compared with it).
ROWS_AFTER_MAX = 2**63 - 1
ROWS_PARAMETERS = [
    OpenApiParameter(
        "after", {"type": "integer", "minimum": 0, "maximum": ROWS_AFTER_MAX},
        OpenApiParameter.QUERY, required=False,
        description="The last line already read (a line number of the result file, 1 for "
                    "its first line); 0, the default, reads from the start. Pass the "
                    "previous page's Anex-Next-After."),
    OpenApiParameter(
        "limit", {"type": "integer", "minimum": 1, "maximum": ROWS_LIMIT_MAX},
        OpenApiParameter.QUERY, required=False,
        description=f"The most lines a page holds, 1 to {ROWS_LIMIT_MAX:,} (default "
                    f"{ROWS_LIMIT_DEFAULT:,}). A page may hold fewer: only rows finished "
                    "in order are read, and one page reads a bounded number of chunks."),
    OpenApiParameter(
        "Anex-Next-After", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[200],
        description="The line number of this page's last line (the after you sent when "
                    "the page is empty): the after of the next request. The page holds "
                    "exactly Anex-Next-After minus after lines."),
    OpenApiParameter(
        "Anex-Rows-Ahead", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[200],
        description="Rows already finished after Anex-Next-After: readable on the next "
                    "pages, or (while the job runs) once the rows before them finish."),
]
ROWS_DESCRIPTION = (
    "The result's lines after line `after`, as JSONL (application/jsonl), streamed: while "
    "the job runs, the finished rows in file order as far as they are contiguous (a row "
    "finished past one still running waits, counted in Anex-Rows-Ahead); once it has "
    "ended, every line of the result. A running job's line is the result file's line "
    "without its last member, \"cost\" (the job's charge is shared over its rows only "
    "when it is priced at the end): the final line is the same bytes with "
    ",\"cost\":{\"credits\":\"…\"} before the closing brace. Once the job has "
    "ended, a JSONL job's pages are the result file's lines byte for byte, so the pages "
    "read from after=0 join up to the file; a parquet job's pages are its rows' JSONL "
    "envelopes without cost, while it runs and after (docs/output-format.md). An empty "
    "page (nothing new yet) is 200 with Anex-Next-After equal to after.")


class AnyAccept(DefaultContentNegotiation):
    """GET /jobs/{id}/rows answers JSONL whatever Accept asks for (its page is a stream,
    not rendered), and a refusal the usual JSON object: no 406 for a client that asks
    for application/jsonl."""

    def select_renderer(self, request: Request, renderers: Iterable[BaseRenderer],
                        format_suffix: str | None = None) -> tuple[BaseRenderer, str]:
        first = next(iter(renderers))
        return first, first.media_type


class JobRowsView(APIView):
    content_negotiation_class = AnyAccept

    @extend_schema(
        operation_id="getJobRows", parameters=[JOB_ID, *ROWS_PARAMETERS],
        responses={(200, "application/jsonl"): OpenApiResponse(
                       OpenApiTypes.STR, description=ROWS_DESCRIPTION),
                   409: _error(f"No row finished yet ({NO_ROW_YET}), or the job ended "
                               f"with nothing to deliver ({NOTHING_DELIVERED})"),
                   410: _error("Result data deleted"),
                   **ERRORS},
        summary="Read the finished rows, while the job runs and after: a page of JSONL")
    def get(self, request: Request, job_id: str) -> StreamingHttpResponse:
        job = job_get(organization=request_organization(request), id=job_id)
        region_require(request, residency=job.data_residency, noun="job")
        after = _count(request, "after", ROWS_COUNTS["after"])
        limit = _count(request, "limit", ROWS_COUNTS["limit"])
        page = job_rows_page(job=job, after=after, limit=limit)
        response = StreamingHttpResponse(page.lines, content_type="application/jsonl")
        response["Anex-Next-After"] = str(page.next_after)
        response["Anex-Rows-Ahead"] = str(page.ahead)
        response["Cache-Control"] = "no-store"
        return response


# A rows query's counts: default, least, most, and the 422's words.
ROWS_COUNTS: dict[str, tuple[int, int, int, str]] = {
    "after": (0, 0, ROWS_AFTER_MAX, "after must be a whole number, 0 or more."),
    "limit": (ROWS_LIMIT_DEFAULT, 1, ROWS_LIMIT_MAX,
              f"limit must be a whole number from 1 to {ROWS_LIMIT_MAX}."),
}


def _count(request: Request, name: str, rule: tuple[int, int, int, str]) -> int:
    """A whole number in the query (digits only), within its bounds; 422 otherwise."""
    default, least, most, problem = rule
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(most)) \
            or not least <= int(raw) <= most:
        raise ApiError(422, problem)
    return int(raw)


class JobRerunView(APIView):
    @extend_schema(operation_id="rerunJob", request=RerunIn,
                   parameters=[JOB_ID, IDEMPOTENCY_PARAMETER],
                   responses={200: RerunOut, 409: _error(
                       "Not finished, no rows with those outcomes, or "
                       f"{IN_FLIGHT_DESCRIPTION}"),
                       410: _error("The job's data or input is gone"),
                       **ERRORS},
                   extensions=links(200, "job_id", JOB_OPERATIONS),
                   summary="Run a finished job's failed rows again, as a new (child) job")
    @idempotent
    def post(self, request: Request, job_id: str) -> Response:
        body = RerunIn(data=request.data or {})  # the request's shape first, as a submit's
        body.is_valid(raise_exception=True)
        job = job_get(organization=request_organization(request), id=job_id)
        include = body.validated_data.get("include") or DEFAULT_INCLUDE
        child, rows = job_rerun(job=job, actor=request_actor(request), include=include,
                                host_region=request_region(request))
        return Response(RerunOut({"child": child, "row_count": rows}).data)


class ChecksView(APIView):
    @extend_schema(operation_id="createCheck", request=JobCreateIn,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={202: CheckStateOut, 409: _error(
                       f"Input not ready yet, or {IN_FLIGHT_DESCRIPTION}"),
                       410: _error("Input expired: its file is deleted"),
                       **ERRORS},
                   extensions=links(202, "check_id", ("getCheck",)),
                   summary="Check an input's rows for a model without running them (free)")
    @idempotent
    def post(self, request: Request) -> Response:
        check = check_create(organization=request_organization(request),
                             actor=request_actor(request),
                             host_region=request_region(request), request=_job_request(request))
        return Response(CheckStateOut(check).data, status=202)


class CheckView(APIView):
    @extend_schema(operation_id="getCheck", parameters=[CHECK_ID],
                   responses={200: CheckOut, **ERRORS},
                   summary="A preflight check's outcome: every failing row, up to 1,000")
    def get(self, request: Request, check_id: str) -> Response:
        check = check_get(organization=request_organization(request), id=check_id)
        # Its errors quote the rows: read only where the input's data is kept.
        region_require(request, residency=check.input.data_residency, noun="check")
        return Response(CheckOut(check).data)


class JobDataView(APIView):
    @extend_schema(operation_id="deleteJobData", request=None, parameters=[JOB_ID],
                   responses={200: JobDataDeletedOut, 202: JobDataDeletedOut, **ERRORS},
                   summary="Delete a job's data now (a job in flight is cancelled first)")
    def delete(self, request: Request, job_id: str) -> Response:
        job = job_get(organization=request_organization(request), id=job_id)
        job, gone = job_data_delete(job=job, actor=request_actor(request))
        deleted: dict[str, object] = {"job": job}
        if not gone:
            deleted["message"] = STOPPING
        return Response(JobDataDeletedOut(deleted).data, status=200 if gone else 202)
