"""The Keys page: create (the secret shown once), list, revoke with a confirmation."""

from __future__ import annotations

from datetime import UTC, datetime, time
from uuid import UUID

from allauth.account.decorators import reauthentication_required
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from anex.errors import PaymentRequired
from console.forms import ApiKeyForm
from console.selectors import api_key_get, api_key_list
from console.services import api_key_create, api_key_revoke
from console.views.base import Console, console_page, page


@require_http_methods(["GET", "POST"])
@console_page()
# Creating a key asks for a recent re-authentication (allauth's; the form's POST is
# replayed once it is done): docs/dev/decisions/2026-12-02-the-console-hardened.md.
@reauthentication_required(allow_get=True)
def keys_page(request: HttpRequest, console: Console) -> HttpResponse:
    form = ApiKeyForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        day = form.cleaned_data.get("expires_at")
        try:
            key, plaintext = api_key_create(
                organization=console.organization, actor=console.actor,
                name=form.cleaned_data["name"], model_scopes=form.cleaned_data["model_scopes"],
                spend_budget_cents=form.spend_budget_cents,
                expires_at=datetime.combine(day, time.min, tzinfo=UTC) if day else None)
        except ValidationError as error:  # a member's key without a budget, or too many keys
            form.add_error("spend_budget" if error.code == "budget" else None, error)
        except PaymentRequired as error:  # past the member's spending limit
            form.add_error("spend_budget", error.detail)
        else:
            # Shown in this one response and kept nowhere (not even the session): only the
            # key's digest is stored.
            new_key = {"id": str(key.pk), "plaintext": plaintext}
            form = ApiKeyForm()
    response = page(request, console, "console/keys.html", "keys", form=form,
                    keys=api_key_list(organization=console.organization), new_key=new_key)
    if new_key is not None:
        response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@console_page()
def key_revoke_page(request: HttpRequest, console: Console, key_id: UUID) -> HttpResponse:
    key = api_key_get(organization=console.organization, id=key_id)
    if request.method == "POST":
        api_key_revoke(key=key, actor=console.actor)
        messages.success(request, f"Revoked {key.display}. Requests with it now answer 401.")
        return redirect("console-keys")
    return page(request, console, "console/confirm.html", "keys",
                title=f"Revoke {key.display}{f' ({key.name})' if key.name else ''}?",
                text=("Every request made with this key is refused from now on. This cannot "
                      "be undone: create a new key if you need one again."),
                action=reverse("console-key-revoke", args=[key.pk]), button="Revoke key",
                cancel=reverse("console-keys"))
