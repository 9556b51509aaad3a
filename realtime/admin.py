"""The realtime API in the admin: the operator's freeze switch (written through
realtime.services.admission), and the metered usage and its settlements, read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.forms import ModelForm
from django.http import HttpRequest

from console.admin import ReadOnlyAdmin
from realtime.models import (
    RealtimeSettlement,
    RealtimeSwitch,
    RealtimeUsage,
    RealtimeUsageDaily,
)
from realtime.services.admission import realtime_switch_set
from realtime.services.settlement import realtime_settlement_lag_seconds


@admin.register(RealtimeSwitch)
class RealtimeSwitchAdmin(admin.ModelAdmin):
    list_display = ("__str__", "frozen", "reason", "changed_at", "changed_by")
    fields = ("frozen", "reason", "changed_at", "changed_by")
    readonly_fields = ("changed_at", "changed_by")

    def has_add_permission(self, request: HttpRequest) -> bool:
        # One switch: created on first save through the service, never a second row.
        return not RealtimeSwitch.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: RealtimeSwitch, form: ModelForm,
                   change: bool) -> None:
        user = request.user if request.user.is_authenticated else None
        saved = realtime_switch_set(frozen=obj.frozen, reason=obj.reason,
                                    user=user)  # type: ignore[arg-type]
        obj.pk, obj.changed_at, obj.changed_by = saved.pk, saved.changed_at, saved.changed_by


@admin.register(RealtimeSettlement)
class RealtimeSettlementAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "organization", "api_key", "through_usage_id",
                    "metered_usd", "charged_cents")
    list_select_related = ("organization", "api_key")


@admin.register(RealtimeUsage)
class RealtimeUsageAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "organization", "api_key", "endpoint", "model",
                    "input_tokens", "cost_usd", "settled")
    list_filter = ("settled", "endpoint", "model")
    list_select_related = ("organization", "api_key")

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> Any:
        # The settlement's lag, the age of the oldest unsettled row, above the list.
        lag = realtime_settlement_lag_seconds()
        return super().changelist_view(request, {
            **(extra_context or {}),
            "title": f"Realtime usage (settlement lag: {lag:,.0f} s)"})


@admin.register(RealtimeUsageDaily)
class RealtimeUsageDailyAdmin(ReadOnlyAdmin):
    list_display = ("day", "organization", "api_key", "endpoint", "model", "requests",
                    "input_tokens", "cost_usd")
    list_filter = ("endpoint", "model")
    list_select_related = ("organization", "api_key")
