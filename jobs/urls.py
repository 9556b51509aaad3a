"""The batch API, mounted at /batch/v1/."""

from django.urls import path

from jobs.api import InputsView, InputView

urlpatterns = [
    path("inputs", InputsView.as_view(), name="inputs"),
    path("inputs/<str:input_id>", InputView.as_view(), name="input"),
]
