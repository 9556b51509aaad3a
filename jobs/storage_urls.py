from django.urls import path

from jobs.storage_views import download, upload

urlpatterns = [
    path("<str:region>/upload", upload, name="storage-upload"),
    path("<str:region>/download/<path:key>", download, name="storage-download"),
]
