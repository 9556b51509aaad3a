"""Test-only endpoints built exactly as every batch endpoint is built (authentication,
scoped read, one error envelope), mounted beside the product's own URLs."""

from __future__ import annotations

from typing import Any

from django.urls import path
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from anex.api.authentication import request_key, request_organization
from anex.regions import region_require
from anex.urls import urlpatterns as product_urlpatterns
from console.selectors import api_key_get

handler404 = "anex.api.errors.handler404"
handler500 = "anex.api.errors.handler500"


class ProbeKeyView(APIView):
    def get(self, request: Request, key_id: str) -> Response:
        key = api_key_get(organization=request_organization(request), id=key_id)
        return Response({"id": str(key.id), "caller": str(request_key(request).id)})


class ProbeBodySerializer(serializers.Serializer):
    name = serializers.CharField()
    count = serializers.IntegerField(min_value=1)


class ProbeBodyView(APIView):
    def post(self, request: Request) -> Response:
        body = ProbeBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(body.validated_data)


class ProbeRegionView(APIView):
    def get(self, request: Request, residency: str) -> Response:
        region_require(request, residency=residency, noun="job")
        return Response({"residency": residency})


class ProbeCrashView(APIView):
    def get(self, request: Request) -> Any:
        raise RuntimeError("boom")


urlpatterns = [
    path("batch/v1/_probe/keys/<str:key_id>", ProbeKeyView.as_view()),
    path("batch/v1/_probe/body", ProbeBodyView.as_view()),
    path("batch/v1/_probe/region/<str:residency>", ProbeRegionView.as_view()),
    path("realtime/v1/_probe/crash", ProbeCrashView.as_view()),
    *product_urlpatterns,
]
