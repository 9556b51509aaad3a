"""Both storage backends keep one contract: upload targets, streamed writes under a cap,
heads, links, deletes. S3 runs against a real S3-compatible server on loopback (moto's
standalone server), which performs the calls but does not enforce a POST policy: policy
enforcement is tested on the local backend (tests/db/test_inputs.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import requests
from pytest_django import Settings
from rest_framework.test import APIClient

from anex.regions import Region
from inference.constants import InputFormat
from jobs.models import Input
from jobs.services.inputs import input_copy, input_upload_create
from jobs.storage import RegionStorage, StorageTooLarge, storage_for
from tests.factories import SYSTEM, organization_make
from tests.lazy import lazy_module
from tests.servers import LocalServer, reply, tls_context

if TYPE_CHECKING:
    import boto3
    import moto.server as moto_server
else:  # imported by the first test that uses them, not by every worker's collection
    boto3, moto_server = lazy_module("boto3"), lazy_module("moto.server")

BUCKETS = {"world": "anex-test-world", "eu": "anex-test-eu"}
DATA = b'{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"input":"x"}}\n' * 40


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    for bucket in BUCKETS.values():
        client.create_bucket(Bucket=bucket)
    settings.ANEX_STORAGE_BACKEND = "s3"
    settings.ANEX_S3_BUCKETS = BUCKETS
    settings.ANEX_S3_REGIONS = {"world": "us-east-1", "eu": "us-east-1"}
    settings.ANEX_S3_ENDPOINT_URL = s3_endpoint
    return s3_endpoint


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, settings: Settings, tmp_path) -> RegionStorage:  # type: ignore[no-untyped-def]
    if request.param == "s3":
        request.getfixturevalue("s3")
    else:
        live_server = request.getfixturevalue("live_server")
        settings.ANEX_STORAGE_BACKEND = "local"
        settings.ANEX_STORAGE_ROOT = tmp_path / "storage"
        settings.ANEX_API_ORIGIN = live_server.url
    return storage_for("world")


@pytest.mark.django_db(transaction=True)
def test_an_upload_target_takes_a_form_post(storage: RegionStorage) -> None:
    # The local form takes a file only for an input awaiting one (tests/db/test_input_freeze.py).
    item, _ = input_upload_create(organization=organization_make(), actor=SYSTEM,
                                  fmt=InputFormat.JSONL, residency=Region.WORLD)
    key = item.object_key
    target = storage.upload_target(key=key, max_bytes=10_000, expires_in=600)
    assert target.fields["key"] == key
    response = requests.post(target.url, data=target.fields,
                             files={"file": ("data.jsonl", DATA)}, timeout=30)
    assert response.status_code == 204, response.text
    assert storage.exists(key) and storage.size(key) == len(DATA)
    assert storage.read_head(key, 10) == DATA[:10]


def test_streamed_writes_land_whole_or_not_at_all(storage: RegionStorage) -> None:
    key = "inputs/test/stream.jsonl"
    chunks = [DATA[i:i + 100] for i in range(0, len(DATA), 100)]
    assert storage.write_stream(key, iter(chunks), max_bytes=len(DATA)) == len(DATA)
    with storage.open(key) as handle:
        assert handle.read() == DATA
    with pytest.raises(StorageTooLarge):
        storage.write_stream("inputs/test/too-big.jsonl", iter(chunks), max_bytes=len(DATA) - 1)
    assert not storage.exists("inputs/test/too-big.jsonl")


def test_an_object_is_read_from_a_byte_on(storage: RegionStorage) -> None:
    storage.write_stream("results/o/j/result.jsonl", iter([b"one\n", b"two\n", b"three\n"]),
                         max_bytes=100)
    for start, expected in ((0, [b"one\n", b"two\n", b"three\n"]), (4, [b"two\n", b"three\n"]),
                            (10, [b"ree\n"])):
        with storage.open_at("results/o/j/result.jsonl", start) as stream:
            assert list(stream) == expected


def test_download_links_fetch_the_object_and_deletes_remove_it(storage: RegionStorage) -> None:
    key = "results/test/out.jsonl"
    storage.write_stream(key, iter([DATA]), max_bytes=len(DATA))
    link = storage.download_url(key, expires_in=300, filename="out.jsonl")
    response = requests.get(link, timeout=30)
    assert response.status_code == 200 and response.content == DATA
    assert "out.jsonl" in response.headers["Content-Disposition"]
    assert response.headers["Content-Type"] == "application/jsonl"  # as either backend names it
    resumed = requests.get(link, headers={"Range": "bytes=10-"}, timeout=30)
    assert resumed.status_code == 206 and resumed.content == DATA[10:]
    storage.delete(key)
    storage.delete(key)  # already gone is fine
    assert not storage.exists(key)


def test_uris_name_the_regions_bucket(storage: RegionStorage) -> None:
    assert storage.uri("inputs/a/b.jsonl").endswith("/inputs/a/b.jsonl")
    assert storage.uri("k").startswith("s3://")


@pytest.mark.django_db
def test_the_api_hands_out_s3_targets_and_settles_them(s3: str, api: APIClient) -> None:
    created = api.post("/batch/v1/inputs", {"format": "jsonl"}, format="json").json()
    assert created["upload_url"].startswith(s3)
    assert created["input_s3_uri"].startswith(f"s3://{BUCKETS['world']}/inputs/")
    assert {"key", "policy"} <= set(created["fields"])
    uploaded = requests.post(created["upload_url"], data=created["fields"],
                             files={"file": ("data.jsonl", DATA)}, timeout=30)
    assert uploaded.status_code == 204
    polled = api.get(f"/batch/v1/inputs/{created['id']}").json()
    assert (polled["status"], polled["size_bytes"]) == ("ready", len(DATA))


@pytest.mark.django_db
def test_ingest_streams_into_s3(s3: str, api: APIClient, make_server, ca, trust_ca: None,  # type: ignore[no-untyped-def]
                                loopback: None) -> None:
    source: LocalServer = make_server(tls=tls_context(ca, "127.0.0.1"))
    source.routes["/in.jsonl"] = lambda handler: reply(handler, 200, DATA)
    created = api.post("/batch/v1/inputs", {"source_url": source.url("/in.jsonl")},
                       format="json").json()
    input_copy(input_id=created["id"])
    item = Input.objects.get(pk=created["id"])
    assert item.status == "ready"
    body = boto3.client("s3", endpoint_url=s3, region_name="us-east-1").get_object(
        Bucket=BUCKETS["world"], Key=item.object_key)["Body"].read()
    assert body == DATA


def test_s3_links_name_the_public_endpoint_and_the_services_keep_theirs(
        s3: str, settings: Settings) -> None:
    # Issue 40 L13: MinIO is reached at http://minio:9000 inside compose; customers reach it
    # through the https proxy, and their links must name that.
    settings.ANEX_S3_PUBLIC_ENDPOINT_URL = "https://storage.example.com"
    storage = storage_for("world")
    storage.write_stream("results/org/out.jsonl", iter([DATA]), max_bytes=len(DATA))
    link = storage.download_url("results/org/out.jsonl", expires_in=300, filename="out.jsonl")
    target = storage.upload_target(key="inputs/org/in.jsonl", max_bytes=10, expires_in=60)
    assert link.startswith("https://storage.example.com/")
    assert target.url.startswith("https://storage.example.com/")
    assert storage.read_head("results/org/out.jsonl", 10) == DATA[:10]  # through s3's own
