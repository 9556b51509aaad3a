"""The OpenAI-compatible batch surface, mounted at /openai/v1/ (docs/openai.md)."""

from django.urls import path

from openai_api.api import (
    BatchCancelView,
    BatchesView,
    BatchView,
    FileContentView,
    FilesView,
    FileView,
)

urlpatterns = [
    path("files", FilesView.as_view(), name="openai-files"),
    path("files/<str:file_id>", FileView.as_view(), name="openai-file"),
    path("files/<str:file_id>/content", FileContentView.as_view(), name="openai-file-content"),
    path("batches", BatchesView.as_view(), name="openai-batches"),
    path("batches/<str:batch_id>", BatchView.as_view(), name="openai-batch"),
    path("batches/<str:batch_id>/cancel", BatchCancelView.as_view(), name="openai-batch-cancel"),
]
