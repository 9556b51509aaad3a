"""A job's charge spread over its rows: each result row says what it cost, and the rows'
costs add up to the charge exactly
(docs/dev/decisions/2026-12-01-preflight-checks-per-row-cost-re-runs-and-progress-events.md,
"Per-row cost").

The job is priced once, at the end (inference.pricing.price: its exact cost rounded up to a
whole credit, floored at 1 credit and at the model's minimum job price). Each row's share
is that charge in proportion to the row's own exact price, cut to SHARE_PLACES decimals by
cumulative rounding: row i's share is floor(C x W_i / W) - floor(C x W_(i-1) / W), where
W_i is the running total of the rows' exact prices and W their sum. The shares telescope
to C exactly, each is within 10^-SHARE_PLACES of its proportional value, none is negative,
and the rows are allocated one at a time in file order, so a million-row result is written
without holding its rows.

A row that was not billed (a failed row) weighs nothing and costs "0". A job whose billed
rows have no exact price at all (zero rates) spreads its charge evenly over them.
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, Context, Decimal, localcontext

SHARE_PLACES = 9
_QUANTUM = Decimal(1).scaleb(-SHARE_PLACES)
# Enough digits for C x W_i exactly: a charge of 10^12 credits over weights of 40 digits.
ALLOCATION_CONTEXT = Context(prec=80)
ZERO = Decimal(0)


class ChargeAllocator:
    """Hands out a charge of `charge` credits over rows whose weights add up to
    `total_weight`, one row at a time, in the order the weights were summed."""

    def __init__(self, *, charge: int, total_weight: Decimal) -> None:
        if charge < 0 or total_weight < 0:
            raise ValueError("a charge and its weights are never negative")
        self.charge = Decimal(charge)
        self.total = total_weight
        self._running = ZERO
        self._allocated = ZERO

    def share(self, weight: Decimal) -> Decimal:
        """The next row's share, in credits (SHARE_PLACES decimals)."""
        if not weight or not self.total:
            return ZERO
        with localcontext(ALLOCATION_CONTEXT):
            self._running += weight
            if self._running >= self.total:
                upto = self.charge  # the last weighed row closes the sum exactly
            else:
                upto = (self.charge * self._running / self.total).quantize(
                    _QUANTUM, rounding=ROUND_FLOOR)
            share = upto - self._allocated
            self._allocated = upto
        return share

    @property
    def allocated(self) -> Decimal:
        return self._allocated


def credits_text(amount: Decimal) -> str:
    """A share as the result file writes it: a plain decimal string, no exponent and no
    trailing zeros ("0.0123", "1", "0")."""
    text = format(amount.quantize(_QUANTUM).normalize(), "f")
    return "0" if text in ("-0", "0.0") else text
