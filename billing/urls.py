from django.urls import path

from billing.views import stripe_webhook

urlpatterns = [
    path("stripe/webhook", stripe_webhook, name="stripe-webhook"),
]
