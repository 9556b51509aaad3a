from django.contrib import admin

from billing.models import LedgerEntry
from console.admin import ReadOnlyAdmin


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "organization", "kind", "balance_delta", "held_delta", "job",
                    "staff_user", "reason"]
    list_filter = ["kind"]
    search_fields = ["organization__name", "idempotency_key", "stripe_event_id", "reason"]
    date_hierarchy = "created_at"
