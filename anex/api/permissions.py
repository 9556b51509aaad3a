from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework.permissions import BasePermission

from console.models import ApiKey

if TYPE_CHECKING:
    # DRF imports this module while rest_framework.views is still loading.
    from rest_framework.request import Request
    from rest_framework.views import APIView


class HasApiKey(BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.auth, ApiKey)
