"""Issue 40 M4: an organization keeps at most so many inputs, and so many bytes of them
(jobs.services.quota). Inputs, OpenAI files and ingests of up to the input cap each were
kept 7 days, unbounded in number: the attacks below store one more than the quota allows,
by each door, and are refused; deleting what is stored frees the room."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from console.actors import Actor
from console.models import Organization
from console.services import organization_update
from jobs.constants import InputStatus, JobStatus
from jobs.models import Input, Job
from jobs.services.inputs import input_refresh, inputs_expire
from jobs.storage import storage_for
from tests.db.test_console import form, signed_in
from tests.factories import SYSTEM, input_ready, job_make, organization_make

pytestmark = pytest.mark.django_db
INPUTS = "/batch/v1/inputs"
ROWS = b'{"custom_id":"row-1","method":"POST","url":"/v1/chat/completions","body":{}}\n'


def target(api: APIClient) -> Any:
    return api.post(INPUTS, {"format": "jsonl"}, format="json")


def test_the_input_past_the_count_is_429_naming_the_quota_and_deleting_data_frees_it(
        api: APIClient, organization: Organization, settings: Settings) -> None:
    settings.ANEX_STORED_INPUTS_MAX = 3
    # given two inputs that landed (one a finished job's) and an open upload target
    kept = input_ready(organization, ROWS)
    job = job_make(organization, status=JobStatus.DONE)
    Job.objects.filter(pk=job.pk).update(input=input_ready(organization, ROWS))
    assert target(api).status_code == 200
    # when a fourth is asked for
    refused = target(api)
    # then it is refused with the reference's status for an organization's cap, naming
    # the quota, the usage and how to free space; nothing is created
    assert refused.status_code == 429
    detail = refused.json()["detail"]
    assert detail.startswith("Storage quota reached: this organization keeps 3 inputs, and "
                             "its quota is 3.")
    assert "DELETE /batch/v1/jobs/{id}/data" in detail and "kept 7 days" in detail
    assert "error" not in refused.json()  # told apart from the rate limit, as the queue's is
    # Retry-After: when the soonest frees itself (the open target's window, about an hour)
    assert 3500 < int(refused["Retry-After"]) <= 3600
    assert Input.objects.for_org(organization).count() == 3
    # when the finished job's data is deleted, its input with it
    assert api.delete(f"/batch/v1/jobs/{job.pk}/data").status_code == 200
    # then there is room again
    assert target(api).status_code == 200
    assert Input.objects.get(pk=kept.pk).deleted_at is None


def test_an_upload_target_counts_as_the_cap_until_its_file_lands(
        api: APIClient, organization: Organization, settings: Settings) -> None:
    settings.ANEX_INPUT_MAX_BYTES = 1000
    settings.ANEX_STORED_INPUT_BYTES_MAX = 2500
    first, second = target(api).json(), target(api).json()
    # two open targets hold 2,000 of the 2,500 bytes: a third could land 1,000 more
    refused = target(api)
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith(
        "Storage quota reached: this organization's inputs take 2.0 KiB of its 2.4 KiB "
        "quota, and an upload not yet made counts as the 1,000 bytes input cap until its "
        "file lands (2 of its inputs have not landed yet and count as the cap each until "
        "they do).")
    # once a file lands, it counts as its real size
    for created in (first, second):
        item = Input.objects.get(pk=created["id"])
        storage_for("world").write_stream(item.object_key, iter([ROWS]), max_bytes=1000)
        assert input_refresh(item=item).status == InputStatus.READY
    assert target(api).status_code == 200


def test_a_file_landing_larger_than_declared_is_judged_on_its_real_size(
        api: APIClient, organization: Organization, settings: Settings) -> None:
    # A store that does not enforce the upload policy (moto's, a misconfigured bucket)
    # lets a form land more than the cap it signed: the size that counts is the object's.
    settings.ANEX_INPUT_MAX_BYTES = 1000
    settings.ANEX_STORED_INPUT_BYTES_MAX = 1500
    created = target(api).json()
    item = Input.objects.get(pk=created["id"])
    storage = storage_for("world")
    storage.write_stream(item.object_key, iter([ROWS * 30]), max_bytes=10_000)
    polled = api.get(f"{INPUTS}/{item.pk}").json()
    assert polled["status"] == "failed"
    assert polled["error"].startswith("Storage quota reached: this organization's inputs "
                                      "take 0 bytes of its 1.5 KiB quota, and this file is "
                                      "2.3 KiB.")
    # refused, its file deleted; its form could be replayed (S3 takes a presigned POST
    # until it expires), so it counts as the cap until its window closes and the sweep
    # deletes its key once more
    assert not storage.exists(item.object_key)
    assert target(api).status_code == 429
    Input.objects.filter(pk=item.pk).update(upload_expires_at=timezone.now())
    storage.write_stream(item.object_key, iter([ROWS * 30]), max_bytes=10_000)  # replayed
    assert inputs_expire() == 1
    assert not storage.exists(item.object_key)
    assert target(api).status_code == 200


def test_staff_set_an_organizations_own_quota_and_its_owner_cannot(
        organization: Organization, settings: Settings, client_for: Any) -> None:
    from django.core.exceptions import PermissionDenied

    from tests.factories import api_key_make, user_make

    settings.ANEX_STORED_INPUTS_MAX = 1
    organization_update(organization=organization, actor=SYSTEM, stored_inputs_max=2)
    api = client_for(api_key_make(organization)[1])
    assert target(api).status_code == 200 and target(api).status_code == 200
    assert target(api).status_code == 429
    other = client_for(api_key_make(organization_make())[1])
    assert target(other).status_code == 200 and target(other).status_code == 429
    owner = user_make(organization)
    with pytest.raises(PermissionDenied):
        organization_update(organization=organization, actor=Actor(user=owner),
                            stored_inputs_max=1000)


def test_the_console_upload_is_refused_alike(organization: Organization,
                                             settings: Settings) -> None:
    settings.ANEX_STORED_INPUTS_MAX = 1
    input_ready(organization, ROWS)
    owner: Client = signed_in(organization)[0]
    refused = owner.post("/console/jobs/upload", form(organization, {"format": "jsonl"}))
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("Storage quota reached")


def test_an_ingest_is_refused_before_its_source_is_contacted(
        api: APIClient, organization: Organization, settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.services import inputs

    settings.ANEX_STORED_INPUTS_MAX = 1
    input_ready(organization, ROWS)
    contacted: list[str] = []
    monkeypatch.setattr(inputs, "_advertised_size", contacted.append)
    refused = api.post(INPUTS, {"source_url": "https://example.com/in.jsonl"}, format="json")
    assert refused.status_code == 429 and contacted == []


def test_a_copy_past_the_quota_on_its_real_size_fails_and_keeps_nothing(
        organization: Organization, settings: Settings) -> None:
    from jobs.services.inputs import _copy_settle

    settings.ANEX_STORED_INPUT_BYTES_MAX = 100
    item = Input.objects.create(organization=organization, status=InputStatus.COPYING,
                                format="jsonl", data_residency="world",
                                object_key=f"inputs/{organization.pk}/copied.jsonl",
                                input_s3_uri="s3://x/copied.jsonl",
                                copy_started_at=timezone.now() - timedelta(seconds=1))
    storage = storage_for("world")
    storage.write_stream(item.object_key, iter([ROWS * 3]), max_bytes=10_000)
    item = Input.objects.select_related("organization").get(pk=item.pk)
    assert item.copy_started_at is not None
    with django_capture_on_commit():
        _copy_settle(item, error="", size=len(ROWS) * 3, started=item.copy_started_at,
                     pin="x")
    item.refresh_from_db()
    assert item.status == InputStatus.FAILED and item.error.startswith("Storage quota reached")
    assert not storage.exists(item.object_key)


def django_capture_on_commit() -> Any:
    from django.test import TestCase

    return TestCase.captureOnCommitCallbacks(execute=True)


@pytest.mark.django_db(transaction=True)
def test_an_openai_upload_past_the_quota_is_openais_400_and_deleting_a_file_frees_it(
        live_server: Any, settings: Settings) -> None:
    import openai

    from tests.db.test_openai_batches import client_for, jsonl, line
    from tests.factories import api_key_make

    settings.ANEX_STORED_INPUTS_MAX = 2
    organization = organization_make()
    client = client_for(live_server, api_key_make(organization)[1], max_retries=0)
    content = jsonl(line("r1"))
    first, _second = (client.files.create(file=("a.jsonl", content), purpose="batch")
                      for _ in range(2))
    # the third file past the count: OpenAI's own answer to its storage limit, a 400
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("c.jsonl", content), purpose="batch")
    error = refused.value.body
    assert refused.value.status_code == 400 and isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(
        "Storage quota reached: this organization keeps 2 inputs, and its quota is 2.")
    assert "DELETE /openai/v1/files/{id}" in error["message"]
    assert Input.objects.for_org(organization).count() == 2
    # deleting a file frees its room at once (no batch reads it)
    client.files.delete(first.id)
    third = client.files.create(file=("c.jsonl", content), purpose="batch")
    # the bytes: a file past the room left streams until the room is spent, and is refused
    stored = sum(item.size_bytes or 0 for item in
                 Input.objects.for_org(organization).filter(deleted_at__isnull=True))
    settings.ANEX_STORED_INPUTS_MAX = 10
    settings.ANEX_STORED_INPUT_BYTES_MAX = stored + 100
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("big.jsonl", content * 10), purpose="batch")
    assert "quota, and this file is more than 100 bytes." in refused.value.body["message"]  # type: ignore[index]
    assert [file.id for file in client.files.list()] == [third.id, _second.id]
    kept = Input.objects.for_org(organization).filter(deleted_at__isnull=True)
    assert kept.count() == 2
    assert all(storage_for("world").exists(item.object_key) for item in kept)
