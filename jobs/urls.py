"""The batch API, mounted at /batch/v1/ (the reference's eight endpoints land here)."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
