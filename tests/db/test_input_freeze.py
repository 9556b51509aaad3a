"""Issue 11, items 2 and 7: an input is frozen on the bytes that became ready, and the local
upload form decides everything before it reads the file.

The attack (item 2): estimate a one-row file, POST the same upload form again with many
rows, approve. It must be refused or fail, never run the unchecked rows, and never bill
beyond the one-row estimate. The local form refuses the replay; a swap that bypasses the
form (as replaying an S3 presigned POST does, tests/engine/test_s3_job_path.py) is caught by the
pinned reads at estimate, plan and run. Item 7: an oversize or wrong-region upload is
refused before its body is sent, and each client is throttled."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.services import credits_summary
from console.models import Organization
from inference.pricing import Usage, usage_json
from jobs.constants import ChunkStatus, FailureCode, JobStatus
from jobs.models import Chunk, Input, Job
from jobs.results import chunk_key
from jobs.services.estimation import job_estimate
from jobs.services.inputs import INPUT_CHANGED
from jobs.services.rows import rows_read
from jobs.services.running import HOLD_REACHED, chunk_run, hold_reached, job_start
from jobs.storage import StorageChanged, storage_for
from tests.dispatched import finalizes_run
from tests.factories import input_ready

pytestmark = pytest.mark.django_db(transaction=True)
INPUTS = "/batch/v1/inputs"
JOBS = "/batch/v1/jobs"
MODEL = "qwen3-embedding-8b"  # priced from exact counts: no sample in the way


@pytest.fixture(autouse=True)
def served(settings: Settings, checkpoints: Path) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 1000
    settings.ANEX_CHUNK_ROWS = 2


def rows(count: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": f"row number {i} " + "x" * 200}}).encode()
                    + b"\n" for i in range(count))


def estimated(api: APIClient, item_id: str) -> Job:
    response = api.post(JOBS, {"input_id": item_id, "model": MODEL}, format="json")
    assert response.status_code == 200, response.content
    job_id = response.json()["id"]
    assert job_estimate(job_id=job_id) == JobStatus.COST_READY
    return Job.objects.get(pk=job_id)


def approve(api: APIClient, job: Job) -> None:
    assert api.post(f"{JOBS}/{job.pk}/approve").json()["status"] == "in_progress"


def failed_unbilled(organization: Organization, job: Job, balance: int) -> None:
    job.refresh_from_db()
    assert (job.status, job.failure_code) == (JobStatus.FAILED, FailureCode.INVALID_INPUT)
    assert job.failure_reason == INPUT_CHANGED
    assert not job.chunks.exists() and (job.cost_cents or 0) == 0
    credits = credits_summary(organization=organization)
    assert (credits.balance, credits.held) == (balance, 0)


def post_form(created: dict[str, Any], content: bytes) -> requests.Response:
    return requests.post(created["upload_url"], data=created["fields"],
                         files={"file": ("data.jsonl", content)}, timeout=30)


# --- item 2: the replayed form --------------------------------------------------------


def test_replaying_the_upload_form_after_the_estimate_is_refused(
        api: APIClient, organization: Organization, live_server, settings: Settings,  # type: ignore[no-untyped-def]
        sent: list[str]) -> None:
    # given a one-row file uploaded through the form and estimated
    settings.ANEX_API_ORIGIN = live_server.url
    created = api.post(INPUTS, {"format": "jsonl"}, format="json").json()
    assert post_form(created, rows(1)).status_code == 204
    job = estimated(api, created["id"])
    assert (job.row_count, job.est_cost_cents) == (1, 1)
    # when the same form is posted again with many rows
    replay = post_form(created, rows(2000))
    # then it is refused, the frozen file is untouched, and the job runs its one row
    assert replay.status_code == 403, replay.text
    assert replay.json()["detail"].startswith("AccessDenied: this upload target has been used")
    item = Input.objects.get(pk=created["id"])
    with storage_for("world").open(item.object_key, pin=item.content_pin) as stream:
        assert stream.read() == rows(1)
    approve(api, job)
    assert job_start(job_id=job.pk) == 1
    assert list(job.chunks.values_list("row_count", flat=True)) == [1]


def test_a_file_swapped_after_the_estimate_fails_the_job_unrun_and_unbilled(
        api: APIClient, organization: Organization, sent: list[str]) -> None:
    # given a one-row input estimated at 1 credit
    item = input_ready(organization, rows(1))
    job = estimated(api, str(item.pk))
    balance = credits_summary(organization=organization).balance
    # when the object under its key is replaced with many rows (as a replayed S3 POST does)
    storage_for("world").write_stream(item.object_key, iter([rows(500)]), max_bytes=10**8)
    approve(api, job)
    assert job_start(job_id=job.pk) == 0
    # then the job fails before a chunk exists: nothing sent, the hold released in full
    assert sent == []
    failed_unbilled(organization, job, balance)


def test_a_file_swapped_before_the_estimate_fails_it(api: APIClient,
                                                    organization: Organization) -> None:
    item = input_ready(organization, rows(1))
    storage_for("world").write_stream(item.object_key, iter([rows(3)]), max_bytes=10**8)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": MODEL}, format="json")
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.FAILED
    failed_unbilled(organization, job, credits_summary(organization=organization).balance)


def test_a_file_swapped_while_running_is_never_read(api: APIClient, organization: Organization,
                                                   sent: list[str]) -> None:
    item = input_ready(organization, rows(4))
    job = estimated(api, str(item.pk))
    approve(api, job)
    assert job_start(job_id=job.pk) == 2
    # Same length, other rows: only the pin tells them apart.
    storage_for("world").write_stream(item.object_key, iter([rows(4).replace(b"x", b"y")]),
                                      max_bytes=10**8)
    job = Job.objects.select_related("input").get(pk=job.pk)
    with pytest.raises(StorageChanged):
        rows_read(job, job.chunks.order_by("index")[0])


def test_chunks_stop_once_the_running_cost_reaches_the_hold(
        api: APIClient, organization: Organization, sent: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given a job of three chunks whose first one consumed far more than the whole hold
    item = input_ready(organization, rows(5))
    job = estimated(api, str(item.pk))
    approve(api, job)
    job_start(job_id=job.pk)
    first, *rest = job.chunks.order_by("index")
    assert not hold_reached(job)
    records = [json.dumps({"i": i, "id": f"r{i}", "outcome": "success", "status_code": 200,
                           "body": {"data": []}, "error": None, "output": None,
                           "embedding": [1.0]}).encode() + b"\n" for i in range(2)]
    storage_for("world").write_stream(chunk_key(job, 0), iter(records), max_bytes=10**6)
    Chunk.objects.filter(pk=first.pk).update(
        status=ChunkStatus.DONE, success_rows=2,
        usage=usage_json(Usage(input_tokens=10**9)))
    assert hold_reached(job)

    def engine_called(*args: object) -> None:
        raise AssertionError("a chunk past the hold reached the engine")

    monkeypatch.setattr("jobs.services.running.execute", engine_called)
    # when the rest of its chunks come up (and the finalize the last one sends is run)
    with finalizes_run(monkeypatch):
        assert [chunk_run(chunk_id=chunk.pk) for chunk in rest] == [ChunkStatus.FAILED] * 2
    # then none ran, and the job ended charged no more than it held
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.failure_reason == HOLD_REACHED
    assert job.cost_cents is not None and job.cost_cents <= (job.est_cost_cents or 0)
    assert credits_summary(organization=organization).held == 0


def test_an_honest_jobs_running_cost_stays_under_its_hold(api: APIClient,
                                                        organization: Organization,
                                                        sent: list[str]) -> None:
    item = input_ready(organization, rows(5))
    job = estimated(api, str(item.pk))
    approve(api, job)
    job_start(job_id=job.pk)
    first = job.chunks.order_by("index")[0]
    # Two of five rows at the estimate's own count: well under the hold.
    tokens = (job.est_input_tok or 0) * 2 // 5
    Chunk.objects.filter(pk=first.pk).update(status=ChunkStatus.DONE,
                                              usage=usage_json(Usage(input_tokens=tokens)))
    assert not hold_reached(job)


# --- item 7: the local upload endpoint --------------------------------------------------


def raw_post(url: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
    """POST only `body` while the headers announce Content-Length: the answer must come
    without the rest of the body ever being sent."""
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    with socket.create_connection((parts.hostname, parts.port), timeout=15) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in
                       {"Host": parts.netloc, **headers}.items())
        sock.sendall(f"POST {parts.path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            block = sock.recv(65536)
            assert block, "the server closed without answering"
            data += block
        status_line, _, rest = data.partition(b"\r\n")
        header_block, _, content = rest.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in header_block.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(content) < length:
            block = sock.recv(65536)
            assert block
            content += block
    return int(status_line.split()[1]), json.loads(content)


BOUNDARY = "anexboundary"


def form_head(fields: dict[str, str]) -> bytes:
    """The fields, then the file part's headers: everything before the file's bytes."""
    parts = "".join(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'
                    f"{v}\r\n" for k, v in fields.items())
    return (parts + f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
            'filename="data.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n').encode()


def multipart(length: int) -> dict[str, str]:
    return {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
            "Content-Length": str(length)}


def test_an_oversize_upload_is_refused_before_its_body_is_read(
        api: APIClient, live_server, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_API_ORIGIN = live_server.url
    settings.ANEX_INPUT_MAX_BYTES = 10_000
    created = api.post(INPUTS, {"format": "jsonl"}, format="json").json()
    # 3 GiB announced, nothing sent: answered at once from the headers
    status, body = raw_post(created["upload_url"], multipart(3 * 1024**3), b"")
    assert (status, body["detail"]) == (400, "EntityTooLarge: the file is over the input cap.")
    # Under the server's cap but over this policy's: answered from the fields alone.
    settings.ANEX_INPUT_MAX_BYTES = 10**9
    status, body = raw_post(created["upload_url"], multipart(10**8),
                            form_head(created["fields"]))
    assert (status, body["detail"]) == (400, "EntityTooLarge: the file is over the input cap.")
    assert api.get(f"{INPUTS}/{created['id']}").json()["status"] == "awaiting_upload"


def test_a_policy_used_at_another_regions_endpoint_is_refused_unread(
        api: APIClient, live_server, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_API_ORIGIN = live_server.url
    created = api.post(INPUTS, {"format": "jsonl"}, format="json").json()
    eu_url = created["upload_url"].replace("/storage/world/", "/storage/eu/")
    # A 100 MB file announced; only the fields and the file's headers are ever sent.
    status, body = raw_post(eu_url, multipart(10**8), form_head(created["fields"]))
    assert (status, body["detail"]) == (403, "AccessDenied: the policy is for another "
                                             "region's storage.")
    item = Input.objects.get(pk=created["id"])
    assert not storage_for("eu").exists(item.object_key)
    assert not storage_for("world").exists(item.object_key)


def test_a_spent_form_is_refused_before_its_file_is_read(
        api: APIClient, live_server, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_API_ORIGIN = live_server.url
    created = api.post(INPUTS, {"format": "jsonl"}, format="json").json()
    assert post_form(created, rows(1)).status_code == 204
    status, body = raw_post(created["upload_url"], multipart(10**8),
                            form_head(created["fields"]))
    assert status == 403 and "has been used" in body["detail"]


def test_uploads_are_throttled_per_client(api: APIClient, live_server,  # type: ignore[no-untyped-def]
                                          settings: Settings) -> None:
    settings.ANEX_API_ORIGIN = live_server.url
    settings.ANEX_UPLOADS_PER_MINUTE = 2
    settings.ANEX_TRUSTED_PROXY_COUNT = 1  # the last X-Forwarded-For hop is the client
    created = api.post(INPUTS, {"format": "jsonl"}, format="json").json()

    def attempt(client: str) -> requests.Response:
        # A forged first hop does not make another client.
        return requests.post(created["upload_url"], data={"key": "k", "policy": "p"},
                             files={"file": ("f", b"{}")}, timeout=30,
                             headers={"X-Forwarded-For": f"{uuid.uuid4()}, {client}"})

    one, other = (f"2001:db8::{uuid.uuid4().hex[:4]}" for _ in range(2))
    assert [attempt(one).status_code for _ in range(2)] == [403, 403]
    throttled = attempt(one)
    assert throttled.status_code == 429
    assert throttled.json()["detail"].startswith("SlowDown")
    assert 1 <= int(throttled.headers["Retry-After"]) <= 60
    assert attempt(other).status_code == 403
