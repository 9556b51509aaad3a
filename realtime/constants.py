"""The realtime API's fixed limits, from the reference ("Realtime embeddings", "Realtime
decisions"). The decision limits (64 questions, 50,000 characters) are the catalog's
(laya's max_questions and max_state_chars), read from there."""

from __future__ import annotations

from django.db import models

# What the OpenAI SDK sends when its caller names no encoding_format: it asks for base64
# and reads a float answer unchanged (docs/decisions.md, "Realtime API").
ENCODING_FORMATS = ("float", "base64")

SWITCH_ID = 1  # the one row of RealtimeSwitch


class Endpoint(models.TextChoices):
    EMBEDDINGS = "embeddings"
    SYSTEMONE = "systemone"

