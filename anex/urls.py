from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularYAMLAPIView

from anex.docs import docs_page
from anex.health import healthz, readyz
from anex.metrics import metrics

batch_api = [path("batch/v1/", include("jobs.urls"))]
realtime_api = [path("realtime/v1/", include("realtime.urls"))]
openai_api = [path("openai/v1/", include("openai_api.urls"))]

handler404 = "anex.api.errors.handler404"
handler500 = "anex.api.errors.handler500"

urlpatterns = [
    *batch_api,
    *realtime_api,
    *openai_api,
    # The whole API (batch, realtime, the OpenAI surface) at the root; the batch API alone
    # under its base.
    path("openapi.json", SpectacularJSONAPIView.as_view(), name="openapi-json"),
    path("openapi.yaml", SpectacularYAMLAPIView.as_view(), name="openapi-yaml"),
    path("batch/v1/openapi.json", SpectacularJSONAPIView.as_view(patterns=batch_api),
         name="batch-openapi-json"),
    path("batch/v1/openapi.yaml", SpectacularYAMLAPIView.as_view(patterns=batch_api),
         name="batch-openapi-yaml"),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("docs/", docs_page, name="docs-index"),
    re_path(r"^docs/(?P<slug>[a-z0-9-]+)(?P<suffix>\.md)?$", docs_page, name="docs-page"),
    path("billing/", include("billing.urls")),
    path("storage/", include("jobs.storage_urls")),
    path("console/", include("console.urls")),
    path("accounts/", include("allauth.urls")),
    path("admin/", admin.site.urls),
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
]
