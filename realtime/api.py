"""The realtime API's views (/realtime/v1): thin, one per operation (docs/dev/style.md rule 7)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from anex.api.authentication import request_key
from anex.api.bodylimit import body_read
from anex.api.errors import ApiError, error_json_response
from anex.api.serializers import ErrorOut
from anex.errors import TimedOut, Unavailable
from anex.regions import request_region
from realtime.selectors import realtime_models
from realtime.serializers import (
    DecisionIn,
    DecisionOut,
    EmbeddingsIn,
    EmbeddingsOut,
    ModelListOut,
    decision_out,
    embeddings_out,
)
from realtime.services.admission import realtime_place_give, realtime_place_take
from realtime.services.requests import (
    EmbeddingsRequest,
    realtime_decision_create,
    realtime_embeddings_create,
)

AUTH_ERRORS = {401: "Invalid or inactive key", 422: "Malformed request",
               429: "Rate limited"}
REQUEST_ERRORS = {
    **AUTH_ERRORS,
    400: "Over a limit, media content, or the model sent to the wrong endpoint",
    402: "No credits, or the key's spend budget is used up, or either cannot cover this "
         "request beside the realtime spend not yet settled",
    403: "The EU host, for an organization without EU data routing",
    413: "Request body over its cap",
    421: "An EU-routed organization on the main host",
    429: "Too many concurrent realtime requests, or rate limited",
    501: "The model exists but is not served in realtime",
    502: "The engine failed to answer (or took the request and did not answer in time: "
         "billed)",
    503: "The realtime API is frozen, the balance could not be read, the engine or this "
         "server is at capacity, or the organization's unsettled spend is at its cap",
}


def _responses(errors: dict[int, str]) -> dict[int, OpenApiResponse]:
    return {status: OpenApiResponse(ErrorOut, description=text)
            for status, text in errors.items()}


class ModelsView(APIView):
    @extend_schema(operation_id="listRealtimeModels",
                   responses={200: ModelListOut, **_responses(AUTH_ERRORS)},
                   summary="List the models on offer to this key")
    def get(self, request: Request) -> Response:
        return Response(ModelListOut(realtime_models(key=request_key(request))).data)


class EngineView(APIView):
    """An operation answered by an engine. It reads the request's body whole first, bytes
    only, within the API's body deadline (anex.api.bodylimit): a client that sends slowly
    holds a thread for that long at most and never one of the places (issue 40 M2). Then
    it takes one of this process's realtime places before DRF does anything (the key, the
    rate, the parse): past the process's cap the refusal (503, Retry-After) is answered for
    next to no CPU, where it used to cost about what an answer does, so a saturated web
    tier spends its cores on what it answers (the batch API's reads among them). Its place
    is given back whatever the answer."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            body_read(request)
            realtime_place_take()
        except (TimedOut, Unavailable) as refusal:
            return error_json_response(refusal)
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            realtime_place_give()


class EmbeddingsView(EngineView):
    # The key's rate is counted by the API's throttle, as on the batch API, before the body
    # is parsed: a refused request counts against it as an answered one does.

    @extend_schema(operation_id="createRealtimeEmbeddings", request=EmbeddingsIn,
                   responses={200: EmbeddingsOut, **_responses(REQUEST_ERRORS)},
                   summary="Embed one request's texts (OpenAI's embeddings API)")
    def post(self, request: Request) -> Response:
        body = EmbeddingsIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        return Response(embeddings_out(realtime_embeddings_create(
            key=request_key(request), host_region=request_region(request),
            request=EmbeddingsRequest(model=data["model"], input=data["input"],
                                      dimensions=data.get("dimensions"),
                                      encoding_format=data.get("encoding_format")))))


class DecisionView(EngineView):
    @extend_schema(operation_id="createRealtimeDecision", request=DecisionIn,
                   responses={200: DecisionOut, **_responses(
                       {**REQUEST_ERRORS, 422: "Malformed request, or a question the model "
                                               "refuses (its message names it)"})},
                   summary="Answer typed questions about a text in one pass")
    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise ApiError(422, "The body must be a JSON object: model, state, questions "
                                "and an optional lang.")
        DecisionIn(data=request.data).is_valid(raise_exception=True)
        return Response(decision_out(realtime_decision_create(
            key=request_key(request), host_region=request_region(request),
            body=dict(request.data))))
