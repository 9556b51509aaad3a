"""The realtime API's fixed limits, from the reference ("Realtime embeddings", "Realtime
decisions"). The decision limits (64 questions, 50,000 characters) are the catalog's
(laya's max_questions and max_state_chars), read from there."""

from __future__ import annotations

from django.db import models

# base64 is what the OpenAI SDK sends when its caller names no encoding_format, and what a
# caller who wants base64 sends: it is answered in base64, little-endian float32 as OpenAI
# answers it, which the SDK decodes to floats for the first
# (docs/dev/decisions/2026-12-01-realtime-api.md, "encoding_format").
ENCODING_FORMATS = ("float", "base64")

SWITCH_ID = 1  # the one row of RealtimeSwitch

# The header a forwarded request carries its time left in, in milliseconds: the engine
# server takes the work only before then (realtime/serving.py, realtime/engine_client.py).
ENGINE_TIMEOUT_HEADER = "X-Anex-Timeout-Ms"
# The signature of a forwarded request (an HMAC-SHA256 with ANEX_REALTIME_ENGINE_SECRET of
# its method, Host, path, timestamp, nonce, timeout and body digest: realtime/engine_client
# engine_signature), the Unix time it was signed at, a nonce never sent twice, and the
# SHA-256 of its body (hex): everything an engine server checks is in the head, so a
# request that is not the web tier's is refused before its body is read.
ENGINE_SIGNATURE_HEADER = "X-Anex-Signature"
ENGINE_TIMESTAMP_HEADER = "X-Anex-Timestamp"
ENGINE_NONCE_HEADER = "X-Anex-Nonce"
ENGINE_BODY_DIGEST_HEADER = "X-Anex-Body-SHA256"
# How far a signed request's timestamp may be from the engine server's clock (its nonce is
# remembered that long past the timestamp: a replay within the window is refused too).
ENGINE_SIGNATURE_SECONDS = 60


class Endpoint(models.TextChoices):
    EMBEDDINGS = "embeddings"
    SYSTEMONE = "systemone"

