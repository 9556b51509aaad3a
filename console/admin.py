"""The Django admin for support staff. Writes go through console.services, so every change
made here lands in the audit log under the staff user's name."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.template.response import TemplateResponse

from billing.services import credits_grant, credits_summary
from console.actors import Actor
from console.models import ApiKey, AuditEvent, Membership, Organization
from console.services import (
    ORGANIZATION_SETTINGS,
    STAFF_SETTINGS,
    api_key_revoke,
    organization_create,
    organization_update,
)
from jobs.services.webhook_endpoint import organization_webhook_set, webhook_url_validate


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MembershipInline(ReadOnlyInline):
    model = Membership
    fields = readonly_fields = ("user", "role", "created_at")


class ApiKeyInline(ReadOnlyInline):
    model = ApiKey
    fields = readonly_fields = ("display", "name", "created_at", "last_used_at", "revoked_at",
                                "expires_at")


class OrganizationForm(ModelForm):
    # A webhook URL typed without a scheme is https: deliveries are https-only.
    webhook_url = forms.URLField(max_length=2000, required=False, assume_scheme="https")

    class Meta:
        model = Organization
        fields = ["name", "webhook_url", "auto_approve", "eu_data_routing", "progress_webhooks",
                  "stored_inputs_max", "stored_input_bytes_max"]

    def clean_webhook_url(self) -> str:
        # The same check organization_webhook_set makes, shown on the field.
        url: str = self.cleaned_data["webhook_url"]
        if url:
            webhook_url_validate(url, organization_id=self.instance.pk)
        return url


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    form = OrganizationForm
    list_display = ["name", "id", "eu_data_routing", "auto_approve", "created_at"]
    list_filter = ["eu_data_routing", "auto_approve"]
    search_fields = ["name", "id"]
    fields = ["id", "name", "webhook_url", "auto_approve", "progress_webhooks", "eu_data_routing",
              "stored_inputs_max", "stored_input_bytes_max", "created_at", "credits"]
    readonly_fields = ["id", "created_at", "credits"]
    inlines = [MembershipInline, ApiKeyInline]
    actions = ["grant_credits"]

    def save_model(self, request: HttpRequest, obj: Organization, form: ModelForm,
                   change: bool) -> None:
        actor = Actor(user=request.user)  # type: ignore[arg-type]
        if change:
            organization_update(
                organization=obj, actor=actor,
                **{name: form.cleaned_data[name] for name in ORGANIZATION_SETTINGS},
            )
            organization_webhook_set(organization=obj, actor=actor,
                                     url=form.cleaned_data["webhook_url"])
        else:
            created = organization_create(
                name=form.cleaned_data["name"], actor=actor,
                eu_data_routing=form.cleaned_data["eu_data_routing"],
                auto_approve=form.cleaned_data["auto_approve"],
                progress_webhooks=form.cleaned_data["progress_webhooks"],
            )
            if form.cleaned_data["webhook_url"]:
                organization_webhook_set(organization=created, actor=actor,
                                         url=form.cleaned_data["webhook_url"])
            quotas = {name: form.cleaned_data[name] for name in STAFF_SETTINGS
                      if form.cleaned_data[name] is not None}
            if quotas:
                organization_update(organization=created, actor=actor, **quotas)
            obj.pk = created.pk
            obj._state.adding = False
            obj._state.db = created._state.db

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="Credits (balance / held / available)")
    def credits(self, obj: Organization) -> str:
        if obj.pk is None:
            return "-"
        credits = credits_summary(organization=obj)
        return f"{credits.balance} / {credits.held} / {credits.available}"

    def has_grant_credits_permission(self, request: HttpRequest) -> bool:
        # A grant writes a ledger entry: staff who may only view (or only edit an
        # organization's settings) are not offered the action, nor may they post it.
        return request.user.has_perm("billing.add_ledgerentry")

    @admin.action(description="Grant credits to the selected organizations",
                  permissions=["grant_credits"])
    def grant_credits(self, request: HttpRequest,
                      queryset: QuerySet[Organization]) -> TemplateResponse | None:
        # The admin already drops an action the user lacks; checked again so no other
        # route to this method can skip it.
        if not self.has_grant_credits_permission(request):
            raise PermissionDenied
        form = GrantCreditsForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            actor = Actor(user=request.user)  # type: ignore[arg-type]
            for organization in queryset:
                credits_grant(organization=organization, cents=form.cleaned_data["cents"],
                              reason=form.cleaned_data["reason"], actor=actor)
            self.message_user(
                request, f"Granted {form.cleaned_data['cents']} credits to "
                         f"{queryset.count()} organization(s).", messages.SUCCESS)
            return None
        return TemplateResponse(request, "admin/console/organization/grant_credits.html", {
            **self.admin_site.each_context(request),
            "title": "Grant credits",
            "form": form,
            "organizations": queryset,
            "opts": self.model._meta,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        })


class GrantCreditsForm(forms.Form):
    cents = forms.IntegerField(label="Credits (cents)", min_value=1, max_value=10_000_000)
    reason = forms.CharField(max_length=500, help_text="Recorded in the ledger and audit log.")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable, never written here: the rows are written by services (or never)."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    # Members are added and changed through the console's services.
    list_display = ["user", "organization", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__email", "user__username", "organization__name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    # The secret is never stored; its digest is not shown either.
    list_display = ["display", "name", "organization", "created_by", "created_at",
                    "last_used_at", "revoked_at", "expires_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "organization__name"]
    fields = readonly_fields = ("display", "organization", "name", "created_by", "created_at",
                                "last_used_at", "revoked_at", "expires_at", "model_scopes",
                                "spend_budget_cents", "rate_limit_per_minute")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        # Revoking changes a key: a view-only staff account can look, not revoke.
        return request.user.has_perm("console.change_apikey")

    @admin.action(description="Revoke selected API keys", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        if not self.has_revoke_permission(request):
            raise PermissionDenied
        actor = Actor(user=request.user)  # type: ignore[arg-type]
        for key in queryset.select_related("organization"):
            api_key_revoke(key=key, actor=actor)
        self.message_user(request, f"Revoked {queryset.count()} key(s).", messages.SUCCESS)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "organization", "action", "actor_label", "target_type",
                    "target_id", "request_id"]
    list_filter = ["action"]
    search_fields = ["organization__name", "actor_label", "target_id", "request_id"]
    date_hierarchy = "created_at"
