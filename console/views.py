"""The console's pages. Thin: every change goes through a service."""

from __future__ import annotations

import logging

import stripe
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse

from billing.selectors import ledger_entry_list
from billing.services import credits_summary
from billing.stripe_gateway import checkout_session_create, topup_available
from console.constants import Role
from console.forms import TopupForm
from console.selectors import membership_current

logger = logging.getLogger(__name__)
TOPUP_UNAVAILABLE = "Top-up is unavailable right now: card payments are not set up here."


@login_required
def billing_page(request: HttpRequest) -> HttpResponse:
    membership = membership_current(user=request.user)  # type: ignore[arg-type]
    if membership is None:
        return render(request, "console/no_organization.html")
    organization = membership.organization
    is_owner = membership.role == Role.OWNER
    form = TopupForm(request.POST or None)
    if request.method == "POST":
        if not is_owner:
            raise PermissionDenied("Only an owner can buy credits.")
        if not topup_available():
            messages.error(request, TOPUP_UNAVAILABLE)
            return redirect("console-billing")
        if form.is_valid():
            page = request.build_absolute_uri(reverse("console-billing"))
            try:
                url = checkout_session_create(
                    organization=organization, cents=form.cents,
                    success_url=f"{page}?topup=success", cancel_url=f"{page}?topup=cancelled",
                )
            except stripe.StripeError as exc:
                logger.warning("stripe checkout failed: %s", exc.__class__.__name__)
                messages.error(request, "Stripe could not be reached, and nothing was charged. "
                                        "Please try again.")
                return redirect("console-billing")
            return HttpResponseRedirect(url, status=303)
    return render(request, "console/billing.html", {
        "organization": organization,
        "credits": credits_summary(organization=organization),
        "entries": ledger_entry_list(organization=organization)[:25],
        "form": form,
        "is_owner": is_owner,
        "topup_available": topup_available(),
        "topup_unavailable_message": TOPUP_UNAVAILABLE,
        "topup_result": request.GET.get("topup"),
    })
