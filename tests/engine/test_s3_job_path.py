"""Issue 11, items 12 and 2 on S3: the whole job path (upload, estimate, run, result) against
a real S3-compatible server (moto's standalone server on loopback), through the real broker,
a real Dramatiq worker and the real MiniLM engine.

Iterating botocore's StreamingBody yields 1 KiB chunks, not lines: rows longer than that
are what broke JSONL validation, chunk planning and the result merge on S3. moto does not
enforce POST policies, so it lets the replay of a presigned POST through, as S3 would
within its window: the frozen input (its ETag or VersionId) must refuse it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from billing.services import credits_summary
from console.models import Organization
from jobs.constants import FailureCode, JobStatus
from jobs.models import Input, Job
from jobs.services.estimation import job_estimate
from jobs.services.inputs import INPUT_CHANGED
from jobs.services.running import job_start
from jobs.storage import storage_for
from tests.db.test_storage import BUCKETS, s3, s3_endpoint  # noqa: F401
from tests.dispatched import dispatch_catch
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import api_key_make, organization_make
from tests.workers import fresh_worker

pytestmark = pytest.mark.django_db(transaction=True)
INPUTS = "/batch/v1/inputs"
JOBS = "/batch/v1/jobs"
MODEL = "all-minilm-l6-v2"


@pytest.fixture
def served(s3: str, settings: Settings, checkpoint_dirs: dict[str, Path]) -> str:  # noqa: F811
    settings.ANEX_CHECKPOINTS = {MODEL: checkpoint_dirs["minilm"]}
    settings.ANEX_WORKER_MODELS = [MODEL]
    settings.ANEX_CHUNK_ROWS = 2
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    return s3


@pytest.fixture
def client(served: str) -> tuple[APIClient, Organization]:
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api, organization


@pytest.fixture
def worker(served: str) -> Iterator[Callable[..., None]]:
    with fresh_worker() as wait:
        yield wait


def rows(count: int, width: int = 1500) -> bytes:
    """Embedding rows each longer than botocore's 1 KiB iteration chunk (padded with JSON
    whitespace, so the text stays within the small model's context)."""
    return b"".join(json.dumps({"custom_id": f"row-{i}", "method": "POST",
                                "url": "/v1/embeddings",
                                "body": {"input": f"line {i} of the input"}},
                               separators=(",", ":" + " " * (width // 4))
                               ).encode() + b"\n" for i in range(count))


def uploaded(api: APIClient, content: bytes) -> dict[str, Any]:
    created = api.post(INPUTS, {"format": "jsonl"}, format="json").json()
    assert post(created, content).status_code == 204
    return created


def post(created: dict[str, Any], content: bytes) -> requests.Response:
    return requests.post(created["upload_url"], data=created["fields"],
                         files={"file": ("data.jsonl", content)}, timeout=30)


def status(job_id: str) -> str:
    return Job.objects.get(pk=job_id).status


def test_s3_objects_read_as_lines(served: str) -> None:
    storage = storage_for("world")
    content = rows(3)
    storage.write_stream("inputs/test/lines.jsonl", iter([content]), max_bytes=10**6)
    size, pin = storage.fingerprint("inputs/test/lines.jsonl")
    assert size == len(content) and pin.startswith(("etag:", "version:"))
    with storage.open("inputs/test/lines.jsonl", pin=pin) as stream:
        assert list(stream) == content.splitlines(keepends=True)


def test_a_jsonl_job_runs_end_to_end_on_s3(client, worker, served: str) -> None:  # type: ignore[no-untyped-def]
    # given five rows of 1.5 KB uploaded with the presigned POST
    api, organization = client
    created = uploaded(api, rows(5))
    # when it is submitted, estimated, approved and run by the worker
    job_id = api.post(JOBS, {"input_id": created["id"], "model": MODEL, "dimensions": 64},
                      format="json").json()["id"]
    worker(lambda: status(job_id) in ("cost_ready", "failed"))
    job = Job.objects.get(pk=job_id)
    assert job.status == "cost_ready", job.failure_reason
    assert job.row_count == 5
    assert api.post(f"{JOBS}/{job_id}/approve").json()["status"] == "in_progress"
    worker(lambda: status(job_id) in ("done", "failed", "cancelled"))
    body = api.get(f"{JOBS}/{job_id}").json()
    # then every row ran, in three chunks cut at line ends, into one result file on S3
    assert body["status"] == "done", body
    assert (body["success_rows"], body["error_rows"]) == (5, 0)
    assert Job.objects.get(pk=job_id).chunks.count() == 3
    link = api.get(f"{JOBS}/{job_id}/result").json()["result_url"]
    assert link.startswith(served)
    lines = [json.loads(line) for line in requests.get(link, timeout=30).content.splitlines()]
    assert [line["custom_id"] for line in lines] == [f"row-{i}" for i in range(5)]
    for line in lines:
        vector = line["response"]["body"]["data"][0]["embedding"]
        assert len(vector) == 64
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-3)
    kinds = sorted(LedgerEntry.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert kinds in (["charge", "hold", "release"], ["charge", "hold"])
    assert credits_summary(organization=organization).held == 0


def test_replaying_the_presigned_post_after_the_estimate_fails_the_job_unbilled(
        client, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    dispatch_catch(monkeypatch, lambda message: None, "chunk_run_task")
    api, organization = client
    # given a one-row file estimated at the least a job costs
    created = uploaded(api, rows(1))
    job_id = api.post(JOBS, {"input_id": created["id"], "model": MODEL},
                      format="json").json()["id"]
    assert job_estimate(job_id=job_id) == JobStatus.COST_READY
    balance = credits_summary(organization=organization).balance
    # when the same presigned POST is replayed with many rows (S3 takes it in its window)
    assert post(created, rows(400, width=100)).status_code == 204
    assert api.post(f"{JOBS}/{job_id}/approve").json()["status"] == "in_progress"
    job_start(job_id=job_id)
    # then the job fails before any chunk exists, and the hold is released in full
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.failure_code, job.failure_reason) == (
        JobStatus.FAILED, FailureCode.INVALID_INPUT, INPUT_CHANGED)
    assert not job.chunks.exists() and (job.cost_cents or 0) == 0
    credits = credits_summary(organization=organization)
    assert (credits.balance, credits.held) == (balance, 0)


def test_a_versioned_bucket_runs_the_version_that_was_checked(
        client, served: str, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    dispatch_catch(monkeypatch, lambda message: None, "chunk_run_task")
    boto3.client("s3", endpoint_url=served, region_name="us-east-1").put_bucket_versioning(
        Bucket=BUCKETS["world"], VersioningConfiguration={"Status": "Enabled"})
    try:
        api, _organization = client
        created = uploaded(api, rows(1))
        job_id = api.post(JOBS, {"input_id": created["id"], "model": MODEL},
                          format="json").json()["id"]
        assert job_estimate(job_id=job_id) == JobStatus.COST_READY
        assert Input.objects.get(pk=created["id"]).content_pin.startswith("version:")
        assert post(created, rows(400, width=100)).status_code == 204
        assert api.post(f"{JOBS}/{job_id}/approve").json()["status"] == "in_progress"
        # The replay is a newer version nobody reads: the checked row alone is planned.
        assert job_start(job_id=job_id) == 1
        assert list(Job.objects.get(pk=job_id).chunks.values_list("row_count", flat=True)) \
            == [1]
    finally:
        boto3.client("s3", endpoint_url=served, region_name="us-east-1").put_bucket_versioning(
            Bucket=BUCKETS["world"], VersioningConfiguration={"Status": "Suspended"})
