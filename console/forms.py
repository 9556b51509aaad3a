from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.utils import timezone

from anex.api.bodylimit import SUBMIT_PATHS, body_limit
from anex.api.parsers import JsonRefused, json_bounded_loads
from billing.constants import TOPUP_MAX_CENTS, TOPUP_MIN_CENTS
from console.constants import Role
from console.selectors import console_models
from inference.constants import MAX_OUTPUT_TOKENS
from inference.rows.core import JobOptions
from jobs.constants import Priority
from jobs.services.submission import JobRequest


class TopupForm(forms.Form):
    amount = forms.DecimalField(
        label="Amount (USD)", max_digits=9, decimal_places=2,
        min_value=Decimal(TOPUP_MIN_CENTS) / 100, max_value=Decimal(TOPUP_MAX_CENTS) / 100,
        initial=Decimal(20),
    )

    @property
    def cents(self) -> int:
        return int(self.cleaned_data["amount"] * 100)


def _model_choices() -> list[tuple[str, str]]:
    return [(m.id, m.id) for m in console_models()]


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=200, required=False,
                           help_text="What it is for, e.g. “nightly batch”.")
    model_scopes = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Model scopes",
        help_text="Leave all unchecked for every model.")
    spend_budget = forms.DecimalField(
        required=False, min_value=Decimal("0.01"), max_digits=12, decimal_places=2,
        label="Spend budget (USD)", help_text="The most this key's jobs may spend. Optional.")
    expires_at = forms.DateField(required=False, label="Expires on",
                                 widget=forms.DateInput(attrs={"type": "date"}),
                                 help_text="Optional. The key stops working at the start of "
                                           "that day (UTC).")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model_scopes"].choices = _model_choices()  # type: ignore[attr-defined]

    def clean_expires_at(self) -> Any:
        day = self.cleaned_data.get("expires_at")
        if day is not None and day <= timezone.now().date():
            raise forms.ValidationError("Pick a day after today.")
        return day

    @property
    def spend_budget_cents(self) -> int | None:
        budget = self.cleaned_data.get("spend_budget")
        return None if budget is None else int(budget * 100)


class JobSubmitForm(forms.Form):
    """POST /jobs's fields as a form; the service judges them exactly as it judges the
    API's (a field the model does not take is the API's 422 message)."""

    input_id = forms.UUIDField(widget=forms.HiddenInput)
    model = forms.ChoiceField()
    max_output_tokens = forms.IntegerField(required=False, min_value=1,
                                           max_value=MAX_OUTPUT_TOKENS,
                                           label="Output cap (tokens)")
    # Whether the thinking controls were on the page (a reasoning model was picked): an
    # unchecked checkbox then means "thinking off", not "not asked".
    reasoning_shown = forms.BooleanField(required=False, widget=forms.HiddenInput)
    reasoning = forms.BooleanField(required=False, label="Thinking")
    reasoning_effort = forms.CharField(required=False, max_length=32, label="Thinking effort")
    reasoning_budget = forms.IntegerField(required=False, min_value=1,
                                          max_value=MAX_OUTPUT_TOKENS,
                                          label="Thinking budget (tokens)")
    no_thinking_cap = forms.BooleanField(required=False, label="No thinking cap")
    dimensions = forms.IntegerField(required=False, min_value=1, label="Dimensions")
    video_fps = forms.FloatField(required=False, min_value=0.001, label="Video frames/second")
    response_format = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                      label="Response format (JSON, optional)")
    # The urgency tier (docs/estimates.md, "Urgency tiers"): price and dispatch order.
    priority = forms.ChoiceField(choices=Priority.choices, initial=Priority.STANDARD,
                                 required=False, label="Priority")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = _model_choices()  # type: ignore[attr-defined]

    def clean_response_format(self) -> dict[str, Any] | None:
        raw = self.cleaned_data.get("response_format", "").strip()
        if not raw:
            return None
        try:
            # Bounded as the API's submit body is: a schema nested a thousand levels deep
            # is the caller's error, not a RecursionError (anex/api/parsers.py).
            value = json_bounded_loads(raw, items=body_limit(SUBMIT_PATHS[0]).items,
                                       what="The response format")
        except JsonRefused as refused:
            raise forms.ValidationError(refused.message) from None
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}.") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("A response format is a JSON object.")
        return value

    def options(self) -> JobOptions:
        """The job's options from the cleaned form (is_valid first)."""
        data = self.cleaned_data
        budget = 0 if data.get("no_thinking_cap") else data.get("reasoning_budget")
        return JobOptions(
            model=data["model"], max_output_tokens=data.get("max_output_tokens"),
            reasoning=bool(data.get("reasoning")) if data.get("reasoning_shown") else None,
            reasoning_budget=budget,
            reasoning_effort=data.get("reasoning_effort") or None,
            video_fps=data.get("video_fps"), dimensions=data.get("dimensions"),
            response_format=data.get("response_format"))

    def job_request(self) -> JobRequest:
        return JobRequest(options=self.options(), input_id=str(self.cleaned_data["input_id"]),
                          priority=self.cleaned_data.get("priority") or Priority.STANDARD)


class WebhookForm(forms.Form):
    webhook_url = forms.CharField(
        max_length=2000, required=False, label="Endpoint URL",
        widget=forms.URLInput(attrs={"placeholder": "https://you.example.com/hooks/anex"}),
        help_text="https only. Leave empty to stop sending events.")


class InviteForm(forms.Form):
    email = forms.EmailField(label="Email address")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class SpendLimitForm(forms.Form):
    """An owner's spending limit for a member (the Members page); empty is no limit."""

    member = forms.IntegerField(widget=forms.HiddenInput)
    spend_limit = forms.DecimalField(
        required=False, min_value=Decimal("0.00"), max_digits=12, decimal_places=2,
        label="Spending limit (USD)")

    @property
    def spend_limit_cents(self) -> int | None:
        limit = self.cleaned_data.get("spend_limit")
        return None if limit is None else int(limit * 100)


class OrganizationNameForm(forms.Form):
    name = forms.CharField(max_length=200, label="Organization name")
