"""POST /inputs (upload mode) and GET /inputs/{id}: every status and error the reference
gives, with the upload form POST done over real HTTP the way its curl example does it."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
import requests
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.services import credits_summary
from console.models import ApiKey, Organization
from jobs.constants import InputStatus, JobStatus
from jobs.models import Input, Job
from jobs.services.inputs import input_refresh, inputs_expire
from jobs.storage import storage_for
from tests.factories import api_key_make, input_ready, job_make, organization_make

pytestmark = pytest.mark.django_db
INPUTS = "/batch/v1/inputs"
ROWS = b'{"custom_id":"row-1","method":"POST","url":"/v1/chat/completions","body":{}}\n'


def create(api: APIClient, body: dict, **extra: Any):  # type: ignore[no-untyped-def,type-arg]
    return api.post(INPUTS, body, format="json", **extra)


def test_upload_mode_returns_a_presigned_target(api: APIClient, api_key: ApiKey) -> None:
    response = create(api, {"format": "jsonl"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"id", "status", "upload_url", "fields", "expires_at", "input_s3_uri"}
    assert body["status"] == "awaiting_upload"
    assert body["upload_url"] == "https://api.anex.sh/storage/world/upload"
    assert set(body["fields"]) == {"key", "policy"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", body["expires_at"])
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    assert timedelta(minutes=59) < expires - timezone.now() <= timedelta(hours=1)
    org = api_key.organization_id
    assert body["input_s3_uri"] == f"s3://anex-local-world/inputs/{org}/{body['id']}.jsonl"
    polled = api.get(f"{INPUTS}/{body['id']}").json()
    assert polled["status"] == "awaiting_upload"
    assert polled["expires_at"] == body["expires_at"]
    assert polled["error"] is None


def test_the_upload_form_post_lands_the_file_and_the_input_becomes_ready(
        api: APIClient, live_server, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_API_ORIGIN = live_server.url
    created = create(api, {"format": "jsonl"}).json()
    # As the reference's curl does: every field as a form field, then the file, last.
    uploaded = requests.post(created["upload_url"], data=created["fields"],
                             files={"file": ("data.jsonl", ROWS * 3)}, timeout=30)
    assert uploaded.status_code == 204, uploaded.text
    polled = api.get(f"{INPUTS}/{created['id']}").json()
    assert polled["status"] == "ready"
    assert polled["size_bytes"] == len(ROWS) * 3
    expires = datetime.fromisoformat(polled["expires_at"].replace("Z", "+00:00"))
    assert timedelta(days=6, hours=23) < expires - timezone.now() <= timedelta(days=7)
    item = Input.objects.get(pk=created["id"])
    with storage_for("world").open(item.object_key) as handle:
        assert handle.read() == ROWS * 3


def upload(live_server, api: APIClient, settings: Settings, content: bytes,  # type: ignore[no-untyped-def]
           fields: dict[str, str] | None = None, body: dict | None = None):  # type: ignore[type-arg]
    settings.ANEX_API_ORIGIN = live_server.url
    created = create(api, body or {"format": "jsonl"}).json()
    form = {**created["fields"], **(fields or {})}
    reply = requests.post(created["upload_url"], data=form,
                          files={"file": ("data", content)}, timeout=30)
    return created, reply


def test_an_upload_over_the_cap_is_rejected_by_the_upload_itself(
        api: APIClient, live_server, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_INPUT_MAX_BYTES = 1000
    created, reply = upload(live_server, api, settings, ROWS * 100)
    assert reply.status_code == 400 and "EntityTooLarge" in reply.text
    assert api.get(f"{INPUTS}/{created['id']}").json()["status"] == "awaiting_upload"


def test_a_tampered_policy_or_key_is_refused(api: APIClient, live_server,  # type: ignore[no-untyped-def]
                                             settings: Settings) -> None:
    created, reply = upload(live_server, api, settings, ROWS, {"key": "inputs/x/other.jsonl"})
    assert reply.status_code == 403 and "key does not match" in reply.text
    _created, reply = upload(live_server, api, settings, ROWS,
                             {"policy": created["fields"]["policy"] + "x"})
    assert reply.status_code == 403 and "signature is invalid" in reply.text


def test_an_expired_upload_window_is_refused(api: APIClient, live_server,  # type: ignore[no-untyped-def]
                                             settings: Settings) -> None:
    settings.ANEX_UPLOAD_WINDOW_SECONDS = -1  # already closed when minted
    _created, reply = upload(live_server, api, settings, ROWS)
    assert reply.status_code == 403 and "window has closed" in reply.text


def test_an_uploaded_file_that_is_not_jsonl_fails_the_input(
        api: APIClient, live_server, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    created, reply = upload(live_server, api, settings, b"id,text\n1,hello\n")
    assert reply.status_code == 204
    polled = api.get(f"{INPUTS}/{created['id']}").json()
    assert polled["status"] == "failed"
    assert polled["error"] == "The file is not JSONL: its first line is not a JSON object."


def test_parquet_uploads_are_checked_for_their_magic(api: APIClient, live_server,  # type: ignore[no-untyped-def]
                                                    settings: Settings) -> None:
    created, _ = upload(live_server, api, settings, b"PAR1" + b"\0" * 20 + b"PAR1",
                        body={"format": "parquet"})
    assert created["input_s3_uri"].endswith(".parquet")
    assert api.get(f"{INPUTS}/{created['id']}").json()["status"] == "ready"


def test_an_upload_window_that_lapses_with_nothing_uploaded_expires(api: APIClient) -> None:
    created = create(api, {"format": "jsonl"}).json()
    Input.objects.filter(pk=created["id"]).update(
        upload_expires_at=timezone.now() - timedelta(seconds=1))
    polled = api.get(f"{INPUTS}/{created['id']}").json()
    assert polled["status"] == "expired" and polled["expires_at"] is None
    assert "Create a new input" in polled["error"]


@pytest.mark.parametrize("body,message", [
    ({}, "format is required for a direct upload (jsonl or parquet); to ingest from a URL, "
         "give source_url."),
    ({"format": "csv"}, "format must be jsonl or parquet."),
    ({"format": "jsonl", "callback_url": "https://example.com/hook"},
     "callback_url is not available for a direct upload: there is no server-side copy to "
     "report on."),
    ({"source_url": "http://example.com/in.jsonl"}, "source_url must be an https:// URL."),
    ({"source_url": "ftp://example.com/in.jsonl"}, "source_url must be an https:// URL."),
    ({"source_url": "https://example.com/in.jsonl", "callback_url": "http://example.com/h"},
     "callback_url must be an https:// URL."),
])
def test_the_reference_400s(api: APIClient, body: dict, message: str) -> None:  # type: ignore[type-arg]
    response = create(api, body)
    assert (response.status_code, response.json()) == (400, {"detail": message})
    assert not Input.objects.exists()


@pytest.mark.parametrize("body", [
    {"format": ["jsonl"]},
    {"format": "jsonl", "data_residency": "mars"},
    {"source_url": {"u": 1}},
])
def test_wrongly_typed_fields_are_422(api: APIClient, body: dict) -> None:  # type: ignore[type-arg]
    assert create(api, body).status_code == 422
    assert not Input.objects.exists()


def test_malformed_json_is_400(api: APIClient) -> None:
    response = api.generic("POST", INPUTS, "{", content_type="application/json")
    assert response.status_code == 400


def test_no_credits_is_402_before_anything_is_minted(settings: Settings, client_for) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    assert credits_summary(organization=organization).balance == 0
    _key, plaintext = api_key_make(organization)
    response = create(client_for(plaintext), {"format": "jsonl"})
    assert response.status_code == 402
    assert "balance is zero or below" in response.json()["detail"]
    ingest = create(client_for(plaintext), {"source_url": "https://example.invalid/x.jsonl"})
    assert ingest.status_code == 402
    assert not Input.objects.exists()


def test_eu_without_eu_routing_is_403(api: APIClient) -> None:
    response = create(api, {"format": "jsonl", "data_residency": "eu"})
    assert response.status_code == 403
    assert response.json() == {"detail": "EU data routing is not enabled for this "
                                         "organization. Contact us to enable it."}


@pytest.fixture
def eu_api(client_for):  # type: ignore[no-untyped-def]
    _key, plaintext = api_key_make(organization_make(eu_data_routing=True))
    return client_for(plaintext)


def test_eu_data_asked_of_the_main_host_is_421(eu_api: APIClient) -> None:
    response = create(eu_api, {"format": "jsonl"})  # defaults to eu for this organization
    assert response.status_code == 421
    assert response.json() == {
        "detail": "this input is stored in the EU region; use https://api-eu.anex.sh",
        "residency": "eu", "api": "https://api-eu.anex.sh"}
    assert not Input.objects.exists()


def test_eu_data_goes_to_eu_storage_through_the_eu_host(eu_api: APIClient) -> None:
    response = create(eu_api, {"format": "jsonl"}, HTTP_HOST="api-eu.anex.sh")
    assert response.status_code == 200
    body = response.json()
    assert body["upload_url"] == "https://api-eu.anex.sh/storage/eu/upload"
    assert body["input_s3_uri"].startswith("s3://anex-local-eu/")
    assert eu_api.get(f"{INPUTS}/{body['id']}").status_code == 421
    assert eu_api.get(f"{INPUTS}/{body['id']}", HTTP_HOST="api-eu.anex.sh").status_code == 200


def test_an_eu_organization_may_keep_one_input_in_the_world_region(eu_api: APIClient) -> None:
    response = create(eu_api, {"format": "jsonl", "data_residency": "world"})
    assert response.status_code == 200
    assert response.json()["input_s3_uri"].startswith("s3://anex-local-world/")


def test_another_organizations_input_is_404_like_an_unknown_one(api: APIClient,
                                                                 client_for) -> None:  # type: ignore[no-untyped-def]
    _key, other = api_key_make()
    theirs = create(client_for(other), {"format": "jsonl"}).json()["id"]
    foreign = api.get(f"{INPUTS}/{theirs}")
    unknown = api.get(f"{INPUTS}/{uuid.uuid4()}")
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json() == unknown.json() == {"detail": "Input not found"}


def test_creating_an_input_is_audited_with_its_key(api: APIClient, api_key: ApiKey) -> None:
    created = create(api, {"format": "jsonl"}).json()
    from console.models import AuditEvent

    event = AuditEvent.objects.get(action="input.created", target_id=created["id"])
    assert event.actor_key == api_key
    assert event.data["mode"] == "upload"


def test_inputs_expire_seven_days_after_landing(api: APIClient, live_server,  # type: ignore[no-untyped-def]
                                                settings: Settings) -> None:
    created, _ = upload(live_server, api, settings, ROWS)
    assert api.get(f"{INPUTS}/{created['id']}").json()["status"] == "ready"
    item = Input.objects.get(pk=created["id"])
    storage = storage_for("world")
    assert storage.exists(item.object_key)
    Input.objects.filter(pk=item.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api.get(f"{INPUTS}/{item.pk}").json()["status"] == "expired"
    assert inputs_expire() == 1
    item.refresh_from_db()
    assert item.deleted_at is not None and item.status == InputStatus.EXPIRED
    assert not storage.exists(item.object_key)
    assert inputs_expire() == 0


def test_openapi_describes_the_input_operations() -> None:
    document = APIClient().get("/batch/v1/openapi.json").json()
    assert document["paths"]["/batch/v1/inputs"]["post"]["operationId"] == "createInput"
    assert document["paths"]["/batch/v1/inputs/{input_id}"]["get"]["operationId"] == "getInput"
    assert json.dumps(document)  # serialisable end to end



def test_an_input_past_its_expiry_keeps_its_bytes_until_the_job_reading_it_ends(
        organization: Organization) -> None:
    # Issue 40 L11: the 7-day sweep deleted an input's object under a job still running on
    # it (a long job, or one approved on day 6).
    item = input_ready(organization, ROWS)
    job = job_make(organization, status=JobStatus.IN_PROGRESS)
    Job.objects.filter(pk=job.pk).update(input=item)
    Input.objects.filter(pk=item.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    storage = storage_for("world")
    # when the sweep runs while the job is in progress
    assert inputs_expire() == 0
    # then its bytes are kept; the input reads expired, so nothing new starts on it
    assert storage.exists(item.object_key)
    item = input_refresh(item=Input.objects.get(pk=item.pk))
    assert item.status == InputStatus.EXPIRED and item.deleted_at is None
    # and once the job has ended, the next sweep deletes them
    Job.objects.filter(pk=job.pk).update(status=JobStatus.DONE)
    assert inputs_expire() == 1
    item.refresh_from_db()
    assert item.deleted_at is not None and not storage.exists(item.object_key)


def test_deleting_a_jobs_data_keeps_a_shared_input_under_another_job_until_it_ends(
        api: APIClient, organization: Organization) -> None:
    item = input_ready(organization, ROWS)
    done = job_make(organization, status=JobStatus.DONE)
    running = job_make(organization, status=JobStatus.IN_PROGRESS)
    Job.objects.filter(pk__in=[done.pk, running.pk]).update(input=item)
    assert api.delete(f"/batch/v1/jobs/{done.pk}/data").status_code == 200
    storage = storage_for("world")
    assert storage.exists(item.object_key)
    item.refresh_from_db()
    assert item.status == InputStatus.EXPIRED and item.deleted_at is None
    Job.objects.filter(pk=running.pk).update(status=JobStatus.CANCELLED)
    assert inputs_expire() == 1
    assert not storage.exists(item.object_key)
