"""Issue 22, L9: no row text in the logs. An exception raised with a row in hand often
quotes it; the chunk's failure, the engine's refusal and the realtime engine's failure
were logged with their messages (logger.exception). Each test makes one of them fail with
a row's text in the message and reads the logs for it."""

from __future__ import annotations

import logging

import pytest
from pytest_django import Settings

from anex.logsafe import exception_summary
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
    from realtime import services
    from realtime.engine_client import EngineRefused

    def refused(**kwargs: object) -> None:
        raise EngineRefused(f"400: the prompt {ROW_TEXT} is too long")

    monkeypatch.setattr(services, "engine_call", refused)
    with caplog.at_level(logging.DEBUG), pytest.raises(EngineFailed):
        services._forward(urls=("https://engine",), path="/v1/chat", body={}, what="chat",
                          on_timeout=lambda: 0)
    assert ROW_TEXT not in caplog.text and "EngineRefused" in caplog.text
