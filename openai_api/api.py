"""The OpenAI-compatible batch surface's views (/openai/v1): Files and Batches as OpenAI
serves them, so the official SDK runs unchanged against them (docs/openai.md). Each is a
few lines over openai_api.batches and the anex services; errors are OpenAI's envelope."""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from anex.api.authentication import request_actor, request_organization
from anex.api.errors import (
    MISSING_KEY_DETAIL,
    ApiError,
    as_api_error,
    exception_handler,
    openai_error_body,
)
from anex.regions import region_require, request_region
from anex.transfers import (
    DOWNLOAD,
    UPLOAD,
    TransferStream,
    transfer_held,
    transfer_places_take,
)
from jobs.idempotency import IDEMPOTENCY_PARAMETER, idempotent
from openai_api.batches import (
    batch_cancel,
    batch_create,
    batch_get,
    batch_object,
    batches_page,
    file_chunks,
    file_delete,
    file_get,
    file_object,
    file_residency,
    files_page,
)
from openai_api.serializers import (
    BatchCreateIn,
    BatchListOut,
    BatchOut,
    FileDeletedOut,
    FileListOut,
    FileOut,
    FileUploadIn,
    OpenAIErrorOut,
)
from openai_api.uploads import file_upload

TAGS = ["openai"]
ERRORS = {status: OpenApiResponse(OpenAIErrorOut, description=text) for status, text in {
    400: "Invalid request", 401: "Invalid, inactive or missing key", 404: "Unknown id",
    409: "A request with the same Idempotency-Key still in progress (x-should-retry: false)",
    413: "Request body over its cap", 421: "Data kept in the other region",
    429: "Rate limited, no credits (insufficient_quota), or too many of the organization's "
         "file transfers at once",
    503: "A dependency could not be checked, or this server is at capacity"}.items()}
# The operations that honour an Idempotency-Key answer 422 for a malformed one, or one used
# for another request.
KEYED_ERRORS = {**ERRORS, 422: OpenApiResponse(
    OpenAIErrorOut, description="Idempotency-Key malformed, or used for another request")}
# Statuses the SDK would retry that a retry cannot change (x-should-retry: false).
FINAL = (409,)


def _message(detail: Any) -> str:
    return detail if isinstance(detail, str) else "; ".join(
        f"{name}: {' '.join(map(str, value)) if isinstance(value, list) else value}"
        for name, value in detail.items()) if isinstance(detail, dict) else str(detail)


def openai_answer(error: ApiError) -> Response:
    """An anex answer in OpenAI's envelope and statuses: a body's validation is 400 (the
    view's handler), no credits OpenAI's 429 insufficient_quota (never retried), a missing
    key 401; the rest keep anex's status (an Idempotency-Key reused for another request
    stays 422, the SDK's UnprocessableEntityError)."""
    status, code = error.status, error.extra.get("code")
    param = error.extra.get("param")
    headers: dict[str, str] = {}
    if status == 402:
        status, code = 429, "insufficient_quota"
        headers["x-should-retry"] = "false"
    if status == 401:
        code = code or "invalid_api_key"
    if status in FINAL:
        headers["x-should-retry"] = "false"
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    body = openai_error_body(status, _message(error.detail), code=code, param=param)
    if code == "insufficient_quota":
        body["error"]["type"] = "insufficient_quota"
    return Response(body, status=status, headers=headers)


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, exceptions.NotAuthenticated):
        return openai_answer(ApiError(401, MISSING_KEY_DETAIL))
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail
        param = next(iter(detail), None) if isinstance(detail, dict) else None
        return openai_answer(ApiError(400, _message(detail), extra={"param": param}))
    error = as_api_error(exc)
    if error is None:  # logged, and answered 500, as the anex API answers it
        error = ApiError(500, exception_handler(exc, context).data["detail"])
    return openai_answer(error)


class OpenAIView(APIView):
    """A view of the OpenAI surface: OpenAI's error envelope, JSON whatever the Accept
    header asks, and the request id in x-request-id (the caller's X-Request-ID echoed,
    else ours, anex.requestid)."""

    def get_exception_handler(self) -> Any:
        return openai_exception_handler

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        return super().perform_content_negotiation(request, force=True)

    def finalize_response(self, request: Request, response: Response, *args: Any,
                          **kwargs: Any) -> Response:
        # `response` may also be a plain HttpResponseBase (a file's streamed content).
        if isinstance(response, Response) and response.status_code >= 400 \
                and isinstance(response.data, dict) and "detail" in response.data:
            # An answer made in anex's envelope on the way (the Idempotency-Key wait's 409).
            answer = openai_answer(ApiError(response.status_code, response.data["detail"],
                                            retry_after=_int(response.get("Retry-After"))))
            response.data = answer.data
            for name, value in answer.headers.items():
                response[name] = value
        response = super().finalize_response(request, response, *args, **kwargs)
        response["x-request-id"] = getattr(request._request, "request_id", "")
        return response


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _limit(request: Request, *, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ApiError(400, f"limit must be an integer from 1 to {most}.",
                       extra={"param": "limit"})
    return int(raw)


def _page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


FILE_ID = OpenApiParameter("file_id", OpenApiTypes.STR, OpenApiParameter.PATH,
                           description="The file's id (file-…).")
BATCH_ID = OpenApiParameter("batch_id", OpenApiTypes.STR, OpenApiParameter.PATH,
                            description="The batch's id (batch_…).")
AFTER = OpenApiParameter("after", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False,
                         description="The last id of the previous page.")


def _limit_parameter(default: int, most: int) -> OpenApiParameter:
    return OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": most},
                            OpenApiParameter.QUERY, required=False,
                            description=f"1 to {most}, default {default}.")


class FilesView(OpenAIView):
    parser_classes = [MultiPartParser]

    @extend_schema(operation_id="openaiCreateFile", tags=TAGS,
                   request={"multipart/form-data": FileUploadIn},
                   responses={200: FileOut, **ERRORS},
                   summary="Upload a batch input file (purpose batch), streamed to storage")
    def post(self, request: Request) -> Response:
        organization = request_organization(request)
        # A place before a byte of the file is read (anex.transfers: 429/503 past the caps).
        with transfer_held(direction=UPLOAD, organization_id=organization.pk):
            file = file_upload(organization=organization, actor=request_actor(request),
                               host_region=request_region(request), request=request._request)
        return Response(file_object(file))

    @extend_schema(operation_id="openaiListFiles", tags=TAGS, parameters=[
        AFTER, _limit_parameter(10000, 10000),
        OpenApiParameter("order", {"type": "string", "enum": ["asc", "desc"]},
                         OpenApiParameter.QUERY, required=False),
        OpenApiParameter("purpose", OpenApiTypes.STR, OpenApiParameter.QUERY,
                         required=False)],
        responses={200: FileListOut, **ERRORS}, summary="List files, newest first")
    def get(self, request: Request) -> Response:
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "order must be asc or desc.", extra={"param": "order"})
        files, more = files_page(organization=request_organization(request),
                                 after=request.query_params.get("after"),
                                 limit=_limit(request, default=10000, most=10000), order=order,
                                 purpose=request.query_params.get("purpose"))
        return Response(_page([file_object(file) for file in files], more))


class FileView(OpenAIView):
    @extend_schema(operation_id="openaiGetFile", tags=TAGS, parameters=[FILE_ID],
                   responses={200: FileOut, **ERRORS}, summary="A file")
    def get(self, request: Request, file_id: str) -> Response:
        return Response(file_object(file_get(organization=request_organization(request),
                                             id=file_id)))

    @extend_schema(operation_id="openaiDeleteFile", tags=TAGS, parameters=[FILE_ID],
                   responses={200: FileDeletedOut, **ERRORS}, summary="Delete a file")
    def delete(self, request: Request, file_id: str) -> Response:
        file = file_get(organization=request_organization(request), id=file_id)
        file_delete(file=file)
        return Response({"id": file.id, "object": "file", "deleted": True})


class FileContentView(OpenAIView):
    @extend_schema(operation_id="openaiGetFileContent", tags=TAGS, parameters=[FILE_ID],
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY,
                              **ERRORS},
                   summary="A file's bytes: as uploaded, or a batch's output or error lines")
    def get(self, request: Request, file_id: str) -> HttpResponseBase:
        file = file_get(organization=request_organization(request), id=file_id)
        # Its rows are read only where they are kept (421 from the other region's host).
        region_require(request, residency=file_residency(file), noun="file")
        # Its place is held until the response is closed, however it ends (anex.transfers).
        places = transfer_places_take(direction=DOWNLOAD, organization_id=file.organization_id)
        response = StreamingHttpResponse(TransferStream(file_chunks(file), places),
                                         content_type="application/octet-stream")
        response["Content-Disposition"] = content_disposition_header(
            True, file.filename) or "attachment"
        return response


class BatchesView(OpenAIView):
    @extend_schema(operation_id="openaiCreateBatch", tags=TAGS, request=BatchCreateIn,
                   parameters=[IDEMPOTENCY_PARAMETER],
                   responses={200: BatchOut, **KEYED_ERRORS},
                   summary="Create a batch from an uploaded file: validated, estimated and "
                           "run, no approval step")
    @idempotent
    def post(self, request: Request) -> Response:
        body = BatchCreateIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        batch = batch_create(organization=request_organization(request),
                             actor=request_actor(request), host_region=request_region(request),
                             input_file_id=data["input_file_id"], endpoint=data["endpoint"],
                             completion_window=data["completion_window"],
                             metadata=data.get("metadata"))
        return Response(batch_object(batch))

    @extend_schema(operation_id="openaiListBatches", tags=TAGS,
                   parameters=[AFTER, _limit_parameter(20, 100)],
                   responses={200: BatchListOut, **ERRORS},
                   summary="List batches, newest first")
    def get(self, request: Request) -> Response:
        batches, more = batches_page(organization=request_organization(request),
                                     after=request.query_params.get("after"),
                                     limit=_limit(request, default=20, most=100))
        return Response(_page([batch_object(batch) for batch in batches], more))


class BatchView(OpenAIView):
    @extend_schema(operation_id="openaiGetBatch", tags=TAGS, parameters=[BATCH_ID],
                   responses={200: BatchOut, **ERRORS}, summary="A batch")
    def get(self, request: Request, batch_id: str) -> Response:
        return Response(batch_object(batch_get(organization=request_organization(request),
                                               id=batch_id)))


class BatchCancelView(OpenAIView):
    @extend_schema(operation_id="openaiCancelBatch", tags=TAGS, request=None,
                   parameters=[BATCH_ID, IDEMPOTENCY_PARAMETER],
                   responses={200: BatchOut, **KEYED_ERRORS},
                   summary="Cancel a batch: cancelling, then cancelled, finished rows kept")
    @idempotent
    def post(self, request: Request, batch_id: str) -> Response:
        batch = batch_get(organization=request_organization(request), id=batch_id)
        return Response(batch_object(batch_cancel(batch=batch, actor=request_actor(request))))
