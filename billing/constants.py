from django.db import models


class EntryKind(models.TextChoices):
    GRANT = "grant"
    TOPUP = "topup"
    HOLD = "hold"
    RELEASE = "release"
    CHARGE = "charge"
    REFUND = "refund"
    ADJUSTMENT = "adjustment"


# Top-up amounts an owner may pick, in credits (cents).
TOPUP_MIN_CENTS = 500
TOPUP_MAX_CENTS = 1_000_000
