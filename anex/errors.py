"""The domain's refusals: what a service raises when it will not do what it was asked
(docs/dev/style.md rule 7; the idea of HackSoft's core/exceptions.py).

A service names what went wrong - not found, a wrong state, no credits, a limit - with
the reference's exact message and any field the reference shows beside it (421's
`residency` and `api`, 429's `error.code`), and nothing about HTTP: no raise site names a
status. How each kind of refusal is answered is ANSWERED_WITH below, the reference's error
table as one line per class. The one handler (anex/api/errors.py) reads it for the batch
API, the realtime API and the console's pages alike, so a refusal reads the same whichever
front door it came through; a worker catches these too, never an HTTP error.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A refusal. `detail` is the message the caller reads; `extra`, the fields beside it;
    `retry_after`, seconds to wait before asking again, where the refusal is temporary."""

    def __init__(self, detail: str, *, extra: dict[str, Any] | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra or {}
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        """How the API answers this refusal (ANSWERED_WITH): for the handler, logs and tests."""
        return answered_with(type(self))

    def body(self) -> dict[str, Any]:
        """The reference's envelope: {"detail": …} and the fields beside it."""
        return {"detail": self.detail, **self.extra}


class Invalid(DomainError):
    """The request or its input failed validation: a non-https URL, a file that is not the
    format it claims, a malformed response_format, a value past a realtime limit."""


class PaymentRequired(DomainError):
    """The credits, or the key's spend budget, do not cover what was asked."""


class Forbidden(DomainError):
    """The caller may not do this: EU data routing is off, or a key may not spend on it."""


class NotFound(DomainError):
    """An unknown id, or another organization's: the two read the same."""

    @classmethod
    def of(cls, noun: str) -> NotFound:
        return cls(f"{noun} not found")


class Conflict(DomainError):
    """The object is in the wrong state for this (not yet ready, already past it)."""


class Gone(DomainError):
    """The data this needs was deleted (a purged result, an expired input)."""


class TooLarge(DomainError):
    """A source advertises more bytes than the input cap."""


class WrongRegion(DomainError):
    """The data is kept in the other region; `api` is the origin that serves it."""

    def __init__(self, detail: str, *, residency: str, api: str) -> None:
        super().__init__(detail, extra={"residency": residency, "api": api})


class Malformed(DomainError):
    """The request does not match the operation's shape: a missing or wrongly typed field,
    an unknown model id (or one outside the key's scopes), a field the model does not take."""


class RateLimited(DomainError):
    """Too many at once or too fast; `code` is the reference's error.code where it has one
    (rate_limit_exceeded), told apart from the approval queue's cap by it."""

    def __init__(self, detail: str, *, retry_after: int, code: str | None = None) -> None:
        extra = {"error": {"code": code, "message": detail}} if code is not None else None
        super().__init__(detail, extra=extra, retry_after=retry_after)


class QuotaExceeded(RateLimited):
    """An organization's stored inputs are at its quota (jobs.services.quota): answered as
    the reference's other per-organization caps are (the approval queue's), with the
    seconds until the oldest of them expires in Retry-After."""

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail, retry_after=retry_after)


class NotServed(DomainError):
    """The model exists but is not served this way (a batch-only model sent to realtime)."""


class EngineFailed(DomainError):
    """The engine behind the request failed to answer."""


class TimedOut(DomainError):
    """The client did not send its whole request in time (a body that stalled or trickled
    past the web tier's limits): nothing was done."""


class Unavailable(DomainError):
    """A check this request depends on could not run (the database, the ledger), or the
    API is frozen: nothing was done, retry."""


# The reference's error table, one line per refusal. A subclass is answered as the nearest
# class of its own that is listed (inference.kinds RequestMalformed: as Malformed).
ANSWERED_WITH: dict[type[DomainError], int] = {
    Invalid: 400,
    PaymentRequired: 402,
    Forbidden: 403,
    NotFound: 404,
    TimedOut: 408,
    Conflict: 409,
    Gone: 410,
    TooLarge: 413,
    WrongRegion: 421,
    Malformed: 422,
    RateLimited: 429,
    NotServed: 501,
    EngineFailed: 502,
    Unavailable: 503,
}


def answered_with(cls: type[DomainError]) -> int:
    for base in cls.__mro__:
        if base in ANSWERED_WITH:
            return ANSWERED_WITH[base]  # type: ignore[index]
    raise LookupError(f"{cls.__name__} has no answer in anex.errors.ANSWERED_WITH")
