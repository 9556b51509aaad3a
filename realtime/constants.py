"""The realtime API's fixed limits, from the reference ("Realtime embeddings", "Realtime
decisions"). The decision limits (64 questions, 50,000 characters) are the catalog's
(laya's max_questions and max_state_chars), read from there."""

from __future__ import annotations

from django.db import models

# base64 is what the OpenAI SDK sends when its caller names no encoding_format, and what a
# caller who wants base64 sends: it is answered in base64, little-endian float32 as OpenAI
# answers it, which the SDK decodes to floats for the first (docs/decisions.md).
ENCODING_FORMATS = ("float", "base64")

SWITCH_ID = 1  # the one row of RealtimeSwitch

# The header a forwarded request carries its time left in, in milliseconds: the engine
# server takes the work only before then (realtime/serving.py, realtime/engine_client.py).
ENGINE_TIMEOUT_HEADER = "X-Anex-Timeout-Ms"
# The signature of a forwarded request (an HMAC-SHA256 of the timestamp, the path and the
# body with ANEX_REALTIME_ENGINE_SECRET), and the Unix time it was signed at.
ENGINE_SIGNATURE_HEADER = "X-Anex-Signature"
ENGINE_TIMESTAMP_HEADER = "X-Anex-Timestamp"
# How far a signed request's timestamp may be from the engine server's clock.
ENGINE_SIGNATURE_SECONDS = 60


class Endpoint(models.TextChoices):
    EMBEDDINGS = "embeddings"
    SYSTEMONE = "systemone"

