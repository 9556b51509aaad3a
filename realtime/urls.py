"""The realtime API, mounted at /realtime/v1/ (anex/urls.py)."""

from django.urls import path

from realtime.api import DecisionView, EmbeddingsView, ModelsView

urlpatterns = [
    path("models", ModelsView.as_view(), name="realtime-models"),
    path("embeddings", EmbeddingsView.as_view(), name="realtime-embeddings"),
    path("systemone", DecisionView.as_view(), name="realtime-systemone"),
]
