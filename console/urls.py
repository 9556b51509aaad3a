from django.urls import path

from console.views import billing_page

urlpatterns = [
    path("billing", billing_page, name="console-billing"),
]
