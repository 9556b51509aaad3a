"""The Billing page: balance, held and available credits, spend per day by model, the
ledger, and a Stripe Checkout top-up for owners."""

from __future__ import annotations

import logging

import stripe
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from billing.selectors import ledger_entry_list
from billing.services import credits_summary
from billing.stripe_gateway import checkout_session_create, topup_available
from console.forms import TopupForm
from console.selectors import spend_per_day
from console.views.base import Console, console_page, page
from console.views.charts import spend_chart

logger = logging.getLogger(__name__)
TOPUP_UNAVAILABLE = "Top-up is unavailable right now: card payments are not set up here."


@require_http_methods(["GET", "POST"])
@console_page()
def billing_page(request: HttpRequest, console: Console) -> HttpResponse:
    organization = console.organization
    form = TopupForm(request.POST or None)
    if request.method == "POST":
        if not console.is_owner:
            raise PermissionDenied("Only an owner can buy credits.")
        if not topup_available():
            messages.error(request, TOPUP_UNAVAILABLE)
            return redirect("console-billing")
        if form.is_valid():
            here = request.build_absolute_uri(reverse("console-billing"))
            try:
                url = checkout_session_create(
                    organization=organization, cents=form.cents,
                    success_url=f"{here}?topup=success", cancel_url=f"{here}?topup=cancelled",
                )
            except stripe.StripeError as exc:
                logger.warning("stripe checkout failed: %s", exc.__class__.__name__)
                messages.error(request, "Stripe could not be reached, and nothing was charged. "
                                        "Please try again.")
                return redirect("console-billing")
            return HttpResponseRedirect(url, status=303)
    entries = Paginator(ledger_entry_list(organization=organization), 25)
    return page(request, console, "console/billing.html", "billing",
                credits=credits_summary(organization=organization),
                page_obj=entries.get_page(request.GET.get("page")),
                chart=spend_chart(*spend_per_day(organization=organization)),
                form=form, topup_available=topup_available(),
                topup_unavailable_message=TOPUP_UNAVAILABLE,
                topup_result=request.GET.get("topup"))
