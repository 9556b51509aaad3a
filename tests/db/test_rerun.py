"""Re-runs (POST /jobs/{id}/rerun) and the merged result (GET /jobs/{id}/result?merged=true):
a child job whose input is exactly the parent's rows with the picked outcomes, estimated,
approved, run and billed like any job; the merged file has every row once, each with its
latest outcome."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from console.models import Organization
from inference.constants import RowOutcome
from inference.pricing import Usage
from jobs.constants import JobStatus
from jobs.models import Chunk, Job
from jobs.services.data import DELETED
from jobs.services.estimation import job_estimate
from jobs.services.lifecycle import job_approve
from jobs.services.rerun import job_rerun_input, merged_key
from jobs.services.rows import rows_read
from jobs.services.running import chunk_run, job_finalize, job_start
from jobs.storage import LocalRegionStorage, storage_for
from tests.chunks import chunk_done, row_record
from tests.db.test_cli import anex  # noqa: F401
from tests.dispatched import finalizes_run
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import SYSTEM, chat_request_line, input_ready, job_make, organization_make

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
FAILED = {1, 4, 9, 13, 19}
TRUNCATED = {7, 11}


@pytest.fixture(autouse=True)
def setup(settings: Settings, checkpoints: Path, sent: list[str]) -> None:
    """The tests run the chunks themselves (`sent`: nothing consumes the run queues)."""
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = 4


def parent_outcome(custom_id: str) -> RowOutcome:
    index = int(custom_id.removeprefix("r"))
    return (RowOutcome.ERROR if index in FAILED else
            RowOutcome.TRUNCATED if index in TRUNCATED else RowOutcome.SUCCESS)


def complete(chunk: Chunk, outcome: Callable[[str], RowOutcome], tag: str) -> None:
    """Run a chunk as chunk_run does, its rows read from the job's own input (so exactly
    the rows the job holds), each answered `tag` with the given outcome."""
    job = Job.objects.select_related("input").get(pk=chunk.job_id)
    chunk_done(chunk, [row_record(row.index, row.ident, outcome(row.ident),
                                  Usage(input_tokens=100, output_tokens=10),
                                  answer=f"{tag}:{row.ident}")
                       for row in rows_read(job, chunk)])


def run(job: Job, outcome: Callable[[str], RowOutcome], tag: str) -> Job:
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        complete(chunk, outcome, tag)
    job_finalize(job_id=job.pk)
    job.refresh_from_db()
    return job


def parent_done(organization: Organization, rows: int = 20, *, fmt: str = "jsonl",
                content: bytes | None = None, model: str = "gemma4-12b") -> Job:
    """A finished 20-row job: rows FAILED failed, rows TRUNCATED hit the cap."""
    item = input_ready(organization, content or b"".join(chat_request_line(f"r{i}")
                                                         for i in range(rows)), fmt=fmt)
    job = job_make(organization, est_cost_cents=1000, model=model)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, format=fmt,
                                         max_output_tokens=50,
                                         max_output_tokens_requested=50, reasoning=False)
    job = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    done = run(job, parent_outcome, "parent")
    assert done.status == JobStatus.DONE and done.error_rows == len(FAILED)
    return done


def rerun(api: APIClient, job: Job, **body: Any) -> dict[str, Any]:
    """POST the re-run, then derive the child's input as its job_rerun_input_task does."""
    response = api.post(f"{JOBS}/{job.pk}/rerun", body or None, format="json")
    assert response.status_code == 200, response.content
    assert job_rerun_input(job_id=response.json()["id"]) is not None
    return response.json()  # type: ignore[no-any-return]


def approve_and_run(api: APIClient, child_id: str, outcome: Callable[[str], RowOutcome],
                    tag: str) -> Job:
    assert job_estimate(job_id=child_id) == JobStatus.COST_READY
    assert api.post(f"{JOBS}/{child_id}/approve").json()["status"] == "in_progress"
    return run(Job.objects.get(pk=child_id), outcome, tag)


def local_path(key: str) -> Path:
    storage = storage_for("world")
    assert isinstance(storage, LocalRegionStorage)
    return storage.path(key)


def merged(api: APIClient, job: Job) -> list[dict[str, Any]]:
    response = api.get(f"{JOBS}/{job.pk}/result", {"merged": "true"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["merged"] is True
    # No re-run finished: the link is the plain result's.
    key = merged_key(job) if Job.objects.filter(parent=job).exists() else job.result_key
    lines = [json.loads(line) for line in local_path(key).read_text().splitlines()]
    assert body["row_count"] == len(lines)
    return lines


def test_a_rerun_of_5_failed_rows_runs_exactly_those_5_and_merges_every_row_once(
        api: APIClient, organization: Organization) -> None:
    # given a finished 20-row job with 5 failed rows
    parent = parent_done(organization)
    # when its failed rows are run again
    child_body = rerun(api, parent)
    assert (child_body["status"], child_body["parent_id"], child_body["row_count"]) == (
        "submitted", str(parent.pk), 5)
    child = Job.objects.select_related("input").get(pk=child_body["id"])
    # then the child's input is exactly those 5 request lines, byte for byte
    assert child.input is not None and child.input.pk != parent.input_id
    stored = local_path(child.input.object_key).read_bytes()
    assert stored == b"".join(chat_request_line(f"r{i}") for i in sorted(FAILED))
    # and the two jobs name each other
    assert api.get(f"{JOBS}/{child.pk}").json()["parent_id"] == str(parent.pk)
    assert api.get(f"{JOBS}/{parent.pk}").json()["children"] == [str(child.pk)]
    assert "children" not in api.get(f"{JOBS}/{child.pk}").json()
    assert "parent_id" not in api.get(f"{JOBS}/{parent.pk}").json()
    # it is estimated and approved like any job, then runs exactly those 5 rows
    child = approve_and_run(api, str(child.pk), lambda ident: RowOutcome.SUCCESS, "child")
    assert child.status == JobStatus.DONE and child.row_count == 5
    assert sum(c.row_count for c in child.chunks.all()) == 5
    # and is billed for those 5 alone (100 + 10 tokens each, at gemma4-12b's minimum)
    assert child.cost_cents is not None
    assert LedgerEntry.objects.get(idempotency_key=f"job:{child.pk}:charge").balance_delta \
        == -child.cost_cents
    # the merged result has every row once, in the parent's order, with its latest outcome
    lines = merged(api, parent)
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(20)]
    for index, line in enumerate(lines):
        content = (line["response"]["body"] or {}).get("choices", [{}])[0].get(
            "message", {}).get("content")
        if index in FAILED:
            assert line["error"] is None and content == f"child:r{index}"
        else:
            assert content == f"parent:r{index}"
    # each row's cost is from the job that produced its outcome
    assert sum(Decimal(line["cost"]["credits"]) for i, line in enumerate(lines)
               if i in FAILED) == child.cost_cents
    # the plain result is unchanged
    plain = api.get(f"{JOBS}/{parent.pk}/result").json()
    assert "merged" not in plain and plain["row_count"] == 20


def test_include_picks_truncated_rows_too(api: APIClient, organization: Organization) -> None:
    parent = parent_done(organization)
    body = rerun(api, parent, include=["truncated", "error"])
    assert body["row_count"] == len(FAILED | TRUNCATED)
    child = Job.objects.select_related("input").get(pk=body["id"])
    assert child.rerun_include == ["error", "truncated"]
    assert child.input is not None
    stored = local_path(child.input.object_key).read_bytes()
    assert stored == b"".join(chat_request_line(f"r{i}") for i in sorted(FAILED | TRUNCATED))
    # still failing after the re-run: the merged row keeps the child's (latest) outcome
    child = approve_and_run(api, body["id"], lambda ident: RowOutcome.ERROR
                            if ident == "r4" else RowOutcome.SUCCESS, "child")
    lines = {line["custom_id"]: line for line in merged(api, parent)}
    assert len(lines) == 20
    assert lines["r4"]["error"] is not None and lines["r7"]["error"] is None


def test_a_rerun_of_a_rerun_is_merged_into_the_first_parent(
        api: APIClient, organization: Organization) -> None:
    parent = parent_done(organization)
    first = approve_and_run(api, rerun(api, parent)["id"],
                            lambda ident: RowOutcome.ERROR if ident in ("r9", "r13")
                            else RowOutcome.SUCCESS, "first")
    second_body = rerun(api, first)
    assert second_body["row_count"] == 2
    approve_and_run(api, second_body["id"], lambda ident: RowOutcome.SUCCESS, "second")
    contents = {line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
                for line in merged(api, parent)}
    assert (contents["r1"], contents["r9"], contents["r13"], contents["r2"]) == (
        "first:r1", "second:r9", "second:r13", "parent:r2")


def test_deleting_a_reruns_data_deletes_the_merged_copies_of_its_rows(
        api: APIClient, organization: Organization) -> None:
    # given a re-run of a re-run, merged into both of the jobs above it
    parent = parent_done(organization)
    first = approve_and_run(api, rerun(api, parent)["id"],
                            lambda ident: RowOutcome.ERROR if ident == "r9"
                            else RowOutcome.SUCCESS, "first")
    second = approve_and_run(api, rerun(api, first)["id"],
                             lambda ident: RowOutcome.SUCCESS, "second")
    assert merged(api, parent)[9]["response"]["body"]["choices"][0]["message"]["content"] \
        == "second:r9"
    merged(api, first)
    # when the last re-run's data is deleted
    assert api.delete(f"{JOBS}/{second.pk}/data").status_code == 200
    # then no merged file keeps its rows, and the next merge leaves them out
    assert not local_path(merged_key(parent)).exists()
    assert not local_path(merged_key(first)).exists()
    assert merged(api, parent)[9]["error"] is not None


def test_a_parquet_jobs_rows_are_rerun_and_merged(api: APIClient,
                                                  organization: Organization) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(20)],
                             "prompt": [f"question {i}" for i in range(20)],
                             "extra": list(range(20))}), buffer)
    parent = parent_done(organization, fmt="parquet", content=buffer.getvalue())
    body = rerun(api, parent)
    child = Job.objects.select_related("input").get(pk=body["id"])
    assert child.input is not None
    picked = pq.read_table(local_path(child.input.object_key))
    assert picked.column("id").to_pylist() == [f"r{i}" for i in sorted(FAILED)]
    assert picked.column("extra").to_pylist() == sorted(FAILED)
    approve_and_run(api, body["id"], lambda ident: RowOutcome.SUCCESS, "child")
    response = api.get(f"{JOBS}/{parent.pk}/result", {"merged": "true"}).json()
    assert response["row_count"] == 20
    table = pq.read_table(local_path(merged_key(parent)))
    outputs = dict(zip(table.column("id").to_pylist(), table.column("output").to_pylist(),
                       strict=True))
    assert outputs["r1"] == "child:r1" and outputs["r2"] == "parent:r2"
    assert table.column("error_type").to_pylist().count(None) == 20 - len(TRUNCATED)


def test_merged_without_reruns_is_the_result(api: APIClient,
                                             organization: Organization) -> None:
    parent = parent_done(organization)
    plain = api.get(f"{JOBS}/{parent.pk}/result").json()
    merged_body = api.get(f"{JOBS}/{parent.pk}/result", {"merged": "true"}).json()
    assert {**plain, "merged": True} == {**merged_body, "result_url": plain["result_url"]}
    assert api.get(f"{JOBS}/{parent.pk}/result", {"merged": "yes"}).status_code == 422


def test_a_job_that_has_not_finished_cannot_be_rerun(api: APIClient,
                                                     organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.COST_READY)
    response = api.post(f"{JOBS}/{job.pk}/rerun")
    assert response.status_code == 409
    assert response.json()["detail"] == ("This job is cost_ready: only a finished job (done, "
                                         "failed or cancelled) can have its rows run again.")


def test_a_job_without_such_rows_is_409(api: APIClient, organization: Organization) -> None:
    parent = parent_done(organization)
    response = api.post(f"{JOBS}/{parent.pk}/rerun", {"include": ["format_error"]},
                        format="json")
    assert response.status_code == 409
    assert response.json()["detail"] == ("This job has no rows whose outcome is format_error: "
                                         "there is nothing to run again.")
    assert not Job.objects.filter(parent=parent).exists()


def test_include_is_checked(api: APIClient, organization: Organization) -> None:
    parent = parent_done(organization)
    for include in (["success"], [], "error", ["nope"]):
        response = api.post(f"{JOBS}/{parent.pk}/rerun", {"include": include}, format="json")
        assert response.status_code == 422, (include, response.content)


def test_a_deleted_jobs_rows_cannot_be_rerun(api: APIClient,
                                             organization: Organization) -> None:
    parent = parent_done(organization)
    assert api.delete(f"{JOBS}/{parent.pk}/data").status_code == 200
    assert api.post(f"{JOBS}/{parent.pk}/rerun").status_code == 410
    assert api.get(f"{JOBS}/{parent.pk}/result", {"merged": "true"}).status_code == 410


def test_an_idempotency_key_makes_one_child(api: APIClient,
                                            organization: Organization) -> None:
    parent = parent_done(organization)
    first = api.post(f"{JOBS}/{parent.pk}/rerun", HTTP_IDEMPOTENCY_KEY="rerun-1")
    again = api.post(f"{JOBS}/{parent.pk}/rerun", HTTP_IDEMPOTENCY_KEY="rerun-1")
    assert first.json() == again.json() and again["Idempotent-Replayed"] == "true"
    assert Job.objects.filter(parent=parent).count() == 1


def test_another_organizations_job_is_404(api: APIClient) -> None:
    theirs = parent_done(organization_make())
    for job_id in (theirs.pk, "not-a-uuid"):
        response = api.post(f"{JOBS}/{job_id}/rerun")
        assert (response.status_code, response.json()) == (404, {"detail": "Job not found"})
    assert not Job.objects.filter(parent=theirs).exists()


def test_the_openapi_document_describes_reruns() -> None:
    document = APIClient().get("/openapi.json").json()
    operation = document["paths"]["/batch/v1/jobs/{job_id}/rerun"]["post"]
    assert operation["operationId"] == "rerunJob"
    result = document["paths"]["/batch/v1/jobs/{job_id}/result"]["get"]
    assert any(p["name"] == "merged" for p in result["parameters"])


@pytest.mark.django_db(transaction=True)
def test_the_child_runs_its_rows_on_the_real_engine(
        settings: Settings, client_for: Any, sent: list[str], monkeypatch: pytest.MonkeyPatch,
        checkpoint_dirs: dict[str, Path]) -> None:  # noqa: F811
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": checkpoint_dirs["tiny-qwen3"]}
    organization = organization_make()
    from tests.factories import api_key_make

    api = client_for(api_key_make(organization)[1])
    parent = parent_done(organization, model="tiny-qwen3")
    child_id = rerun(api, parent)["id"]
    Job.objects.filter(pk=child_id).update(max_output_tokens_requested=8)
    assert job_estimate(job_id=child_id) == JobStatus.COST_READY
    sent.clear()
    assert api.post(f"{JOBS}/{child_id}/approve").json()["status"] == "in_progress"
    job_start(job_id=child_id)
    with finalizes_run(monkeypatch):  # the last chunk's finalize, on a CPU worker
        for chunk_id in sent:
            chunk_run(chunk_id=chunk_id)
    child = Job.objects.get(pk=child_id)
    assert child.status == JobStatus.DONE and child.success_rows == len(FAILED)
    lines = merged(api, parent)
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(20)]
    for index in FAILED:
        assert lines[index]["error"] is None
        assert not lines[index]["response"]["body"]["choices"][0]["message"]["content"] \
            .startswith("parent:")


@pytest.mark.django_db(transaction=True)
def test_the_cli_reruns_with_include(anex: Any, organization: Organization) -> None:  # noqa: F811
    parent = parent_done(organization)
    code, out, _ = anex("rerun", str(parent.pk), "--include", "error,truncated", "--json")
    body = json.loads(out)
    assert (code, body["parent_id"], body["row_count"]) == (0, str(parent.pk),
                                                           len(FAILED | TRUNCATED))
    code, out, _ = anex("rerun", str(parent.pk))
    child = Job.objects.filter(parent=parent).order_by("-created_at").first()
    assert child is not None and child.rerun_include == ["error"]
    assert (code, out) == (0, f"rerun as job {child.pk}: submitted\n")


def test_deleting_a_parents_data_deletes_its_reruns_copies_of_its_rows(
        api: APIClient, organization: Organization) -> None:
    # Issue 22, L10: a re-run's input is a copy of its parent's rows; it outlived the
    # parent's DELETE /jobs/{id}/data.
    # given a parent with a finished re-run and one waiting at its estimate
    parent = parent_done(organization)
    finished = approve_and_run(api, rerun(api, parent)["id"],
                               lambda ident: RowOutcome.SUCCESS, "first")
    waiting = Job.objects.get(pk=rerun(api, parent)["id"])
    assert job_estimate(job_id=waiting.pk) == JobStatus.COST_READY
    copies = [local_path(child.input.object_key)
              for child in Job.objects.filter(parent=parent).select_related("input")
              if child.input is not None]
    assert len(copies) == 2 and all(path.exists() for path in copies)
    # when the parent's data is deleted
    assert api.delete(f"{JOBS}/{parent.pk}/data").status_code == 200
    # then no copy of its rows is left: each re-run's data is deleted too, the waiting one
    # cancelled first
    assert not any(path.exists() for path in copies)
    finished.refresh_from_db()
    waiting.refresh_from_db()
    assert finished.data_deleted_at is not None and waiting.data_deleted_at is not None
    assert waiting.status == JobStatus.CANCELLED
    assert not local_path(finished.result_key).exists()
    assert api.get(f"{JOBS}/{finished.pk}/result").status_code == 410


def test_a_rerun_reads_none_of_the_parents_rows_in_the_request(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any) -> None:
    # Issue 22, M4: POST /jobs/{id}/rerun streamed the parent's whole input inside the
    # request and its transaction; a few such requests held web workers for minutes.
    from jobs.storage import LocalRegionStorage
    from tests.dispatched import Sent, dispatch_catch

    parent = parent_done(organization)
    caught: list[Sent] = []
    dispatch_catch(monkeypatch, caught.append, "job_rerun_input_task", "job_estimate_task")
    opened: list[str] = []
    real_open = LocalRegionStorage.open
    def open_noted(self: LocalRegionStorage, key: str, **kw: Any) -> Any:
        opened.append(key)
        return real_open(self, key, **kw)

    monkeypatch.setattr(LocalRegionStorage, "open", open_noted)
    # when a re-run is asked for
    with django_capture_on_commit_callbacks(execute=True):
        body = api.post(f"{JOBS}/{parent.pk}/rerun").json()
    # then it answers the child submitted, with no input yet, and no row was read
    assert (body["status"], body["row_count"]) == ("submitted", len(FAILED))
    assert opened == [] and Job.objects.get(pk=body["id"]).input_id is None
    # and its input is derived by the job_rerun_input_task actor, on the estimate queue
    assert [(s.actor, s.id, s.queue) for s in caught] == [
        ("job_rerun_input_task", body["id"], "estimate")]
    # which, run (twice: a redelivered message), writes one input and sends the estimate
    with django_capture_on_commit_callbacks(execute=True):
        item = job_rerun_input(job_id=body["id"])
    assert item is not None and job_rerun_input(job_id=body["id"]) is None
    assert local_path(item.object_key).read_bytes() == b"".join(
        chat_request_line(f"r{i}") for i in sorted(FAILED))
    assert [s.actor for s in caught[1:]] == ["job_estimate_task"]
    assert Job.objects.get(pk=body["id"]).input_id == item.pk
    # an estimate that arrives before the input is derived leaves the job alone
    early = api.post(f"{JOBS}/{parent.pk}/rerun").json()
    assert job_estimate(job_id=early["id"]) is None
    assert Job.objects.get(pk=early["id"]).status == JobStatus.SUBMITTED


def test_a_lost_rerun_message_is_sent_again_by_the_recovery_pass(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from jobs.services.recovery import SUBMITTED, lease_recover
    from tests.dispatched import Sent, dispatch_catch

    parent = parent_done(organization)
    child_id = api.post(f"{JOBS}/{parent.pk}/rerun").json()["id"]
    caught: list[Sent] = []
    dispatch_catch(monkeypatch, caught.append, "job_rerun_input_task", "job_estimate_task")
    lease_recover(SUBMITTED, timezone.now() + timedelta(minutes=6))
    assert [(s.actor, s.id) for s in caught] == [("job_rerun_input_task", child_id)]


def test_a_rerun_whose_parent_lost_its_data_meanwhile_fails_unbilled(
        api: APIClient, organization: Organization) -> None:
    parent = parent_done(organization)
    child_id = api.post(f"{JOBS}/{parent.pk}/rerun").json()["id"]
    Job.objects.filter(pk=parent.pk).update(data_deleted_at=parent.finished_at)
    assert job_rerun_input(job_id=child_id) is None
    child = Job.objects.get(pk=child_id)
    assert (child.status, child.failure_code, child.input_id) == (
        JobStatus.FAILED, "invalid_input", None)
    assert child.failure_reason == DELETED
    assert not LedgerEntry.objects.filter(idempotency_key=f"job:{child.pk}:charge").exists()


def test_the_merged_file_is_written_once_per_set_of_finished_reruns(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 22, M4: every GET ?merged=true read every row of the job and its re-runs and
    # wrote the file again.
    from jobs.services import rerun as rerun_service

    writes: list[str] = []
    real_write = rerun_service.rows_write
    def write_noted(job: Any, rows: Any, key: str) -> Any:
        writes.append(key)
        return real_write(job, rows, key)

    monkeypatch.setattr(rerun_service, "rows_write", write_noted)
    parent = parent_done(organization)
    first = approve_and_run(api, rerun(api, parent)["id"],
                            lambda ident: RowOutcome.ERROR if ident == "r9"
                            else RowOutcome.SUCCESS, "first")
    # when the merged file is asked for again and again
    bodies = [merged(api, parent) for _ in range(3)]
    # then it was written once, and served the same each time
    assert writes == [merged_key(parent)] and bodies[0] == bodies[1] == bodies[2]
    # a re-run still running changes nothing; once it finishes, the file is written again
    second_id = rerun(api, first)["id"]
    assert merged(api, parent) == bodies[0] and len(writes) == 1
    approve_and_run(api, second_id, lambda ident: RowOutcome.SUCCESS, "second")
    assert merged(api, parent)[9]["response"]["body"]["choices"][0]["message"]["content"] \
        == "second:r9"
    assert len(writes) == 2
    merged(api, parent)
    assert len(writes) == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_requests_write_the_merged_file_once(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 40 L12: every first GET ?merged=true that came in before the file was written
    # read every row of the job and its re-runs and wrote it again.
    import threading

    from django.db import connection

    from jobs.services import rerun as rerun_service
    from jobs.services.rerun import job_result_merged_link
    from tests.race import run_after

    writes: list[str] = []
    real_write = rerun_service.rows_write

    def write_noted(job: Any, rows: Any, key: str) -> Any:
        writes.append(key)
        return real_write(job, rows, key)

    monkeypatch.setattr(rerun_service, "rows_write", write_noted)
    parent = parent_done(organization)
    approve_and_run(api, rerun(api, parent)["id"], lambda ident: RowOutcome.SUCCESS, "first")
    # given four requests that have each looked for the file and found none
    requests = 4
    looked, seen, lock = threading.Barrier(requests), set(), threading.Lock()

    def all_looked(*args: Any, **kwargs: Any) -> None:
        with lock:
            first = threading.get_ident() not in seen
            seen.add(threading.get_ident())
        if first:
            looked.wait(timeout=30)

    answers: list[dict[str, object]] = []

    def ask() -> None:
        try:
            answers.append(job_result_merged_link(job=Job.objects.get(pk=parent.pk)))
        finally:
            connection.close()

    with run_after("jobs.services.rerun._stamped_count", all_looked, every=True):
        threads = [threading.Thread(target=ask) for _ in range(requests)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    # then the file was written once, and every request was answered with it
    assert writes == [merged_key(parent)]
    assert len(answers) == requests and {answer["row_count"] for answer in answers} == {20}
    assert Job.objects.get(pk=parent.pk).merge_claimed_at is None
    assert len(merged(api, parent)) == 20 and len(writes) == 1


def test_a_merge_claim_left_by_a_request_that_died_is_taken_over(
        api: APIClient, organization: Organization) -> None:
    from django.utils import timezone

    from jobs.services.rerun import MERGE_CLAIM_STALE

    parent = parent_done(organization)
    approve_and_run(api, rerun(api, parent)["id"], lambda ident: RowOutcome.SUCCESS, "first")
    Job.objects.filter(pk=parent.pk).update(
        merge_claimed_at=timezone.now() - MERGE_CLAIM_STALE - timedelta(seconds=1))
    assert len(merged(api, parent)) == 20
    assert Job.objects.get(pk=parent.pk).merge_claimed_at is None
