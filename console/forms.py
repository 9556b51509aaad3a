from __future__ import annotations

from decimal import Decimal

from django import forms

from billing.constants import TOPUP_MAX_CENTS, TOPUP_MIN_CENTS


class TopupForm(forms.Form):
    amount = forms.DecimalField(
        label="Amount (USD)", max_digits=9, decimal_places=2,
        min_value=Decimal(TOPUP_MIN_CENTS) / 100, max_value=Decimal(TOPUP_MAX_CENTS) / 100,
        initial=Decimal(20),
    )

    @property
    def cents(self) -> int:
        return int(self.cleaned_data["amount"] * 100)
