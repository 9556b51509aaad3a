"""The realtime API, mounted at /realtime/v1/ (models, embeddings, systemone land here)."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
