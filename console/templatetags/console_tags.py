"""Small formatting filters for the console's pages, and the hidden field that says which
organization a form was rendered for."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

register = template.Library()
# The field every console form carries (console.views.base.console_page refuses a POST
# whose organization is not the one the session now acts in).
FORM_ORGANIZATION = "form_organization"


@register.simple_tag(takes_context=True)
def organization_field(context: template.Context) -> SafeString:
    """The organization this page was rendered for, as a hidden field of its form."""
    return format_html('<input type="hidden" name="{}" value="{}">', FORM_ORGANIZATION,
                       context["organization"].pk)


@register.filter
def credits(cents: int | None) -> str:
    """Credits as dollars: 1 credit is 1 US cent (the reference)."""
    if cents is None:
        return "—"
    sign = "-" if cents < 0 else ""
    return f"{sign}${abs(cents) / 100:,.2f}"


@register.filter
def duration(seconds: int | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{max(seconds, 1)} s"
    # Rounded to the minute first, so 7,199 s reads "2 h 0 min", never "1 h 60 min".
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


@register.filter
def short_id(value: object) -> str:
    return str(value)[:8]


@register.filter
def status_label(status: str) -> str:
    return status.replace("_", " ")


@register.filter
def ago(moment: datetime | None) -> str:
    if moment is None:
        return "—"
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment)} ago"
