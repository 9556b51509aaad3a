"""Secrets kept out of log lines: an invitation's token travels in its link's path
(/console/invitations/<token>), which the web server's access log and Django's request log
write out. Every such token is replaced by "…" in a log line
(docs/dev/decisions/2026-12-01-invitation-tokens-out-of-the-logs-invitations-bounded.md); the link
itself keeps working."""

from __future__ import annotations

import logging
import re

INVITATION_PATH = re.compile(r"(/console/invitations/)[^/?#\s\"']+")
MASK = "…"


def secrets_masked(text: str) -> str:
    """The text with every invitation token replaced."""
    return INVITATION_PATH.sub(rf"\g<1>{MASK}", text) if "/invitations/" in text else text


class SecretsLogFilter(logging.Filter):
    """A logging filter that masks the tokens in a record's message (settings.LOGGING)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = secrets_masked(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True
