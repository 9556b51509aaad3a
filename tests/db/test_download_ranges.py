"""The embedded default's signed download links answer as S3 does (issue 44, downloads
resume): Range gives 206 with Content-Range, past the end 416, an If-Range naming another
version the whole object; the content type is the object's kind; the transfer's places are
given back however a ranged response ends."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from pytest_django import Settings

from anex.transfers import transfers_in_process
from jobs.storage import content_type_of, storage_for

pytestmark = pytest.mark.django_db
DATA = b"".join(b'{"custom_id":"r%d","response":{}}\n' % index for index in range(40))


@pytest.fixture
def link(settings: Settings, tmp_path: Any) -> str:
    settings.ANEX_STORAGE_BACKEND, settings.ANEX_STORAGE_ROOT = "local", tmp_path
    storage = storage_for("world")
    key = "results/org-1/job/result.jsonl"
    storage.write_stream(key, iter([DATA]), max_bytes=len(DATA))
    url = storage.download_url(key, expires_in=300, filename="result.jsonl")
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def test_a_whole_download_names_its_type_and_offers_ranges(link: str) -> None:
    whole = Client().get(link)
    assert whole.status_code == 200
    assert whole["Content-Type"] == "application/jsonl"
    assert whole["Accept-Ranges"] == "bytes"
    assert "result.jsonl" in whole["Content-Disposition"]
    assert body(whole) == DATA


@pytest.mark.parametrize(("header", "first", "last"), [
    ("bytes=0-9", 0, 9),
    ("bytes=10-", 10, len(DATA) - 1),
    ("bytes=-7", len(DATA) - 7, len(DATA) - 1),
    ("bytes=5-100000", 5, len(DATA) - 1),  # the end clipped to the object's
])
def test_a_range_is_answered_206_with_those_bytes(link: str, header: str, first: int,
                                                 last: int) -> None:
    part = Client().get(link, HTTP_RANGE=header)
    assert part.status_code == 206
    assert part["Content-Range"] == f"bytes {first}-{last}/{len(DATA)}"
    assert int(part["Content-Length"]) == last - first + 1
    assert part["Content-Type"] == "application/jsonl"
    assert body(part) == DATA[first:last + 1]
    assert transfers_in_process() == 0  # read to its end: the places are back


def test_a_download_resumed_from_where_it_broke_off_joins_up(link: str) -> None:
    first = Client().get(link, HTTP_RANGE="bytes=0-99")
    etag = first["ETag"]
    rest = Client().get(link, HTTP_RANGE="bytes=100-", HTTP_IF_RANGE=etag)
    assert rest.status_code == 206
    assert body(first) + body(rest) == DATA


def test_a_range_past_the_end_is_416_and_an_other_version_gets_the_whole(link: str) -> None:
    past = Client().get(link, HTTP_RANGE=f"bytes={len(DATA)}-")
    assert past.status_code == 416
    assert past["Content-Range"] == f"bytes */{len(DATA)}"
    assert past.json()["detail"].startswith("InvalidRange")
    stale = Client().get(link, HTTP_RANGE="bytes=10-", HTTP_IF_RANGE='"another-version"')
    assert stale.status_code == 200 and body(stale) == DATA
    # a malformed or multiple range is ignored, as S3 ignores it: the whole object
    for header in ("bytes=0-1,5-6", "items=0-3", "bytes=9-2"):
        whole = Client().get(link, HTTP_RANGE=header)
        assert whole.status_code == 200 and body(whole) == DATA


def test_a_ranged_response_closed_early_gives_its_places_back(link: str) -> None:
    before = transfers_in_process()
    part = Client().get(link, HTTP_RANGE="bytes=0-")
    assert transfers_in_process() == before + 1
    part.close()
    assert transfers_in_process() == before


def test_content_types_follow_the_objects_kind() -> None:
    assert content_type_of("results/o/j/result.jsonl") == "application/jsonl"
    assert content_type_of("results/o/j/result.parquet") == "application/vnd.apache.parquet"
    assert content_type_of("inputs/o/i/input") == "application/octet-stream"
