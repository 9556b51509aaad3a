"""How a worker's claimed work fails unexpectedly (readthedocs' `on_failure`): the service
raises ClaimedWorkFailed, and its actor (jobs/tasks.py) hands the work out again through
its lease (jobs.services.recovery.lease_retry) rather than leaving it claimed until the
lease runs out. A failure the service expects (a row that does not fit, an input that
changed) is the service's own outcome, never this."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager


class ClaimedWorkFailed(Exception):
    """`what` ("estimate", "sample") of job `job_id` failed after it was claimed; the
    cause is the exception chained to it."""

    def __init__(self, what: str, *, job_id: uuid.UUID) -> None:
        super().__init__(f"{what} of job {job_id} failed")
        self.what = what
        self.job_id = job_id


@contextmanager
def claimed_work(what: str, *, job_id: uuid.UUID) -> Iterator[None]:
    """Anything the block raises becomes ClaimedWorkFailed for this work."""
    try:
        yield
    except ClaimedWorkFailed:
        raise
    except Exception as error:
        raise ClaimedWorkFailed(what, job_id=job_id) from error
