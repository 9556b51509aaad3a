"""Issue 22, L9: no row text in the logs. An exception raised with a row in hand often
quotes it; the chunk's failure, the engine's refusal and the realtime engine's failure
were logged with their messages (logger.exception). Each test makes one of them fail with
a row's text in the message and reads the logs for it."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from pytest_django import Settings

from anex.logsafe import exception_summary
from console.models import Organization
from jobs.constants import ChunkStatus
from jobs.services.running import chunk_run, job_start
from tests.db.test_fair_dispatch import approved_job
from tests.dispatched import Sent, dispatch_catch
from tests.factories import organization_make

ROW_TEXT = "my card number is 4111 1111 1111 1111"


def test_a_summary_names_the_class_and_the_place_never_the_message() -> None:
    try:
        try:
            raise KeyError(ROW_TEXT)
        except KeyError as inner:
            raise ValueError(f"could not read {ROW_TEXT}") from inner
    except ValueError as error:
        summary = exception_summary(error)
    assert ROW_TEXT not in summary and "4111" not in summary
    assert summary.startswith("builtins.ValueError at test_row_text_logs.py:")
    assert "; from builtins.KeyError at test_row_text_logs.py:" in summary


@pytest.mark.django_db
def test_a_failed_chunk_logs_no_row_text(monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture,
                                          settings: Settings) -> None:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    sent: list[Sent] = []
    dispatch_catch(monkeypatch, sent.append, "chunk_run_task")
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")
    job = approved_job(organization_make(), rows=1)
    job_start(job_id=job.pk)

    def quoting(*args: object) -> None:
        raise ValueError(f"the engine could not take {ROW_TEXT!r}")

    monkeypatch.setattr("jobs.services.running.execute", quoting)
    with caplog.at_level(logging.DEBUG):
        assert chunk_run(chunk_id=sent[-1].id) == ChunkStatus.PENDING
    logged = "\n".join(record.getMessage() + (record.exc_text or "")
                       for record in caplog.records)
    assert "builtins.ValueError" in logged and ROW_TEXT not in logged
    assert not any(record.exc_info for record in caplog.records)


def test_an_engine_refusal_logs_no_row_text(caplog: pytest.LogCaptureFixture) -> None:
    from inference.engines.chat import _refusal

    with caplog.at_level(logging.DEBUG, logger="inference.engines.chat"):
        error = _refusal(ValueError(f"prompt too long: {ROW_TEXT}"))
    assert ROW_TEXT in error.message  # the customer's own row error keeps it
    assert ROW_TEXT not in caplog.text and "ValueError" in caplog.text


def test_a_realtime_engine_failure_logs_no_request_text(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from anex.errors import EngineFailed
    from realtime.engine_client import EngineRefused
    from realtime.services import requests as services

    def refused(**kwargs: object) -> None:
        raise EngineRefused(f"400: the prompt {ROW_TEXT} is too long")

    monkeypatch.setattr(services, "engine_call", refused)
    with caplog.at_level(logging.DEBUG), pytest.raises(EngineFailed):
        services._forward(urls=("https://engine",), path="/v1/chat", body={}, what="chat",
                          on_timeout=lambda: 0)
    assert ROW_TEXT not in caplog.text and "EngineRefused" in caplog.text


# -- issue 40, L9: the other places that logged a traceback with rows in hand --------------

def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the records would put in a log line, a traceback's text included."""
    formatter = logging.Formatter()
    return "\n".join(formatter.format(record) for record in caplog.records)


def assert_no_row_text(caplog: pytest.LogCaptureFixture, kind: str) -> None:
    text = logged(caplog)
    assert kind in text  # the failure is still logged, by its class and place
    assert ROW_TEXT not in text and "4111" not in text
    assert not any(record.exc_info for record in caplog.records)


@pytest.mark.django_db
def test_a_failed_preflight_check_logs_no_row_text(
        organization: Organization, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from jobs.constants import CheckStatus
    from jobs.models import PreflightCheck
    from jobs.services.checks import check_run
    from tests.factories import chat_request_line, input_ready

    item = input_ready(organization, chat_request_line("r1", ROW_TEXT))
    check = PreflightCheck.objects.create(organization=organization, input=item,
                                          model="gemma4-12b")

    def quoting(**kwargs: object) -> None:
        raise ValueError(f"row 1 could not be read: {ROW_TEXT!r}")

    monkeypatch.setattr("jobs.services.checks.input_check", quoting)
    with caplog.at_level(logging.DEBUG):
        assert check_run(check_id=check.pk) == CheckStatus.FAILED
    assert_no_row_text(caplog, "builtins.ValueError")


def test_a_served_rows_media_that_cannot_be_counted_logs_no_row_text(
        caplog: pytest.LogCaptureFixture) -> None:
    from inference.kinds.metering import RowMeter
    from inference.rows.core import InputRejected

    meter = RowMeter(SimpleNamespace(video_fps=None), None)  # type: ignore[arg-type]

    def quoting() -> None:
        raise InputRejected(f"Row 'r1': the image at {ROW_TEXT} cannot be read")

    with caplog.at_level(logging.DEBUG):
        assert meter._media(quoting) is None
    assert_no_row_text(caplog, "InputRejected")


@pytest.mark.django_db
def test_claimed_work_handed_out_again_logs_no_row_text(
        organization: Organization, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from jobs.failures import ClaimedWorkFailed
    from jobs.tasks import job_estimate_task
    from tests.factories import job_make

    job = job_make(organization)

    def failing(*, job_id: object) -> None:
        try:
            raise ValueError(f"the tokenizer choked on {ROW_TEXT!r}")
        except ValueError as error:
            raise ClaimedWorkFailed("estimate", job_id=job.pk) from error

    monkeypatch.setattr("jobs.tasks.job_estimate", failing)
    monkeypatch.setattr("jobs.tasks.lease_retry", lambda lease, job: None)
    with caplog.at_level(logging.DEBUG):
        job_estimate_task(str(job.pk))
    assert_no_row_text(caplog, "builtins.ValueError")
    assert f"estimate of job {job.pk} failed" in logged(caplog)


def test_an_unhandled_error_in_a_view_logs_no_request_text(
        caplog: pytest.LogCaptureFixture) -> None:
    from anex.api.errors import exception_handler

    with caplog.at_level(logging.DEBUG):
        response = exception_handler(KeyError(ROW_TEXT), {"view": "RealtimeChat"})
    assert response.status_code == 500
    assert_no_row_text(caplog, "builtins.KeyError")
