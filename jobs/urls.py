"""The batch API, mounted at /batch/v1/."""

from django.urls import path

from jobs.api import (
    ChecksView,
    CheckView,
    InputsView,
    InputView,
    JobApproveView,
    JobCancelView,
    JobDataView,
    JobProgressView,
    JobRerunView,
    JobResultView,
    JobRowsView,
    JobsView,
    JobView,
)

urlpatterns = [
    path("inputs", InputsView.as_view(), name="inputs"),
    path("inputs/<str:input_id>", InputView.as_view(), name="input"),
    path("jobs", JobsView.as_view(), name="jobs"),
    path("jobs/<str:job_id>", JobView.as_view(), name="job"),
    path("jobs/<str:job_id>/approve", JobApproveView.as_view(), name="job-approve"),
    path("jobs/<str:job_id>/cancel", JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<str:job_id>/progress", JobProgressView.as_view(), name="job-progress"),
    path("jobs/<str:job_id>/result", JobResultView.as_view(), name="job-result"),
    path("jobs/<str:job_id>/rows", JobRowsView.as_view(), name="job-rows"),
    path("jobs/<str:job_id>/data", JobDataView.as_view(), name="job-data"),
    path("jobs/<str:job_id>/rerun", JobRerunView.as_view(), name="job-rerun"),
    path("checks", ChecksView.as_view(), name="checks"),
    path("checks/<str:check_id>", CheckView.as_view(), name="check"),
]
