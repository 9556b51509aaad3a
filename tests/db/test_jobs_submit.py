"""POST /jobs: each acceptance rule, status code and message, before anything exists."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.services import credits_summary
from console.models import ApiKey, Organization
from jobs.constants import JobStatus
from jobs.models import Input, Job
from tests.factories import api_key_make, input_ready, job_make, organization_make

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
CHAT_ROW = b'{"custom_id":"r1","method":"POST","url":"/v1/chat/completions","body":{}}\n'


@pytest.fixture
def ready(organization: Organization) -> Input:
    return input_ready(organization, CHAT_ROW)


def submit(api: APIClient, body: dict[str, Any], **extra: Any):  # type: ignore[no-untyped-def]
    return api.post(JOBS, body, format="json", **extra)


def uploaded(api: APIClient, content: bytes, fmt: str = "jsonl") -> str:
    """An input through the HTTP API, as the reference's curl does it: POST /inputs for an
    upload target, then the form POST with every field and the file last. Its id."""
    created = api.post("/batch/v1/inputs", {"format": fmt}, format="json").json()
    form = {**created["fields"], "file": SimpleUploadedFile(f"data.{fmt}", content)}
    landed = Client().post(urlsplit(created["upload_url"]).path, form)
    assert landed.status_code == 204, landed.content
    return str(created["id"])


def test_a_valid_submit_creates_a_submitted_job(api: APIClient, ready: Input) -> None:
    response = submit(api, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                            "max_output_tokens": 600, "reasoning": True})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"id", "status"} and body["status"] == "submitted"
    job = Job.objects.get(pk=body["id"])
    assert (job.model, job.task_type, job.format, job.data_residency) == (
        "qwen3.8-27b", "chat", "jsonl", "world")
    assert (job.max_output_tokens, job.reasoning, job.input) == (600, True, ready)


def test_input_s3_uri_finds_the_input(api: APIClient, ready: Input) -> None:
    response = submit(api, {"input_s3_uri": ready.input_s3_uri, "model": "laya"})
    assert response.status_code == 200
    assert Job.objects.get(pk=response.json()["id"]).input == ready


def test_max_tokens_is_accepted_and_echoed(api: APIClient, ready: Input) -> None:
    response = submit(api, {"input_id": str(ready.pk), "model": "gemma4-12b",
                            "max_tokens": 300})
    polled = api.get(f"{JOBS}/{response.json()['id']}").json()
    assert (polled["max_output_tokens"], polled["max_tokens"]) == (300, 300)


def test_the_input_is_never_read_at_submit(api: APIClient, organization: Organization) -> None:
    garbage = input_ready(organization, b'{"not": "a valid row at all"}\n')
    assert submit(api, {"input_id": str(garbage.pk), "model": "laya"}).status_code == 200


UNPROCESSABLE = [
    ({"model": "gpt-4"}, "Unknown model 'gpt-4': pass a model id from the models table, "
                         "verbatim."),
    ({"model": "Qwen3.8-27B"}, "Unknown model 'Qwen3.8-27B': pass a model id from the models "
                               "table, verbatim."),
    ({"model": "laya", "max_output_tokens": 0},
     "max_output_tokens: Ensure this value is greater than or equal to 1."),
    ({"model": "gemma4-12b", "max_output_tokens": 32_769},
     "max_output_tokens: Ensure this value is less than or equal to 32768."),
    ({"model": "gemma4-12b", "max_output_tokens": "100"},
     "max_output_tokens: A valid integer is required."),
    ({"model": "gemma4-12b", "max_output_tokens": 100, "max_tokens": 200},
     "max_tokens is the former name of max_output_tokens: give one of them."),
    ({"model": "gemma4-12b", "reasoning": "yes"}, "reasoning: Must be a valid boolean."),
    ({"model": "qwen3-embedding-8b", "max_output_tokens": 10},
     "max_output_tokens is not accepted on the embedding model 'qwen3-embedding-8b': it "
     "returns vectors, not generated text."),
    ({"model": "qwen3-embedding-8b", "max_tokens": 10},
     "max_tokens is not accepted on the embedding model 'qwen3-embedding-8b': it returns "
     "vectors, not generated text."),
    ({"model": "qwen3-vl-embedding-8b", "reasoning": False, "response_format":
      {"type": "json_object"}, "video_fps": 1},
     "reasoning, response_format, video_fps are not accepted on the embedding model "
     "'qwen3-vl-embedding-8b': it returns vectors, not generated text."),
    ({"model": "laya", "reasoning_effort": "low", "dimensions": 64},
     "reasoning_effort, dimensions are not accepted on the decision model 'laya': it answers "
     "typed questions in one pass, with no generated text."),
    ({"model": "laya", "reasoning_budget": 0},
     "reasoning_budget is not accepted on the decision model 'laya': it answers typed "
     "questions in one pass, with no generated text."),
    ({"model": "qwen3.8-27b", "dimensions": 128},
     "dimensions is for embedding models; 'qwen3.8-27b' is a chat-completions model."),
    ({"model": "qwen3-embedding-8b", "dimensions": 16},
     "dimensions must be from 32 to 4096 on 'qwen3-embedding-8b'; got 16."),
    ({"model": "qwen3-vl-embedding-2b", "dimensions": 4096},
     "dimensions must be from 64 to 2048 on 'qwen3-vl-embedding-2b'; got 4096."),
    ({"model": "gemma4-12b", "reasoning": True},
     "reasoning cannot be true on 'gemma4-12b': it produces no reasoning trace."),
    ({"model": "gemma4-12b", "reasoning_budget": 100},
     "reasoning_budget cannot be set on 'gemma4-12b': it produces no reasoning trace (0 is "
     "accepted)."),
    ({"model": "qwen3.8-27b", "reasoning": False, "reasoning_budget": 1},
     "reasoning_budget needs thinking on: a budget of 1 or more with reasoning false is "
     "refused."),
    ({"model": "qwen3.8-27b", "max_output_tokens": 1000, "reasoning_budget": 937},
     "reasoning_budget must be at least 64 below max_output_tokens (1000); got 937."),
    ({"model": "nemotron-3-nano-omni-30b", "reasoning_effort": "low"},
     "reasoning_effort cannot be set on 'nemotron-3-nano-omni-30b': it has no thinking "
     "effort levels."),
    ({"model": "qwen3.8-27b", "reasoning_effort": "Low"},
     "reasoning_effort must be one of low, medium, xhigh on 'qwen3.8-27b' (case-sensitive); "
     "got 'Low'."),
    ({"model": "qwen3.8-27b", "reasoning_effort": "high"},
     "reasoning_effort must be one of low, medium, xhigh on 'qwen3.8-27b' (case-sensitive); "
     "got 'high'."),
    ({"model": "qwen3.8-27b", "reasoning": False, "reasoning_effort": "low"},
     "reasoning_effort cannot be set with reasoning false."),
    ({"model": "qwen3.8-27b", "video_fps": 25},
     "video_fps 25 is above the 20 fps ceiling of qwen3.8-27b"),
    ({"model": "gemma4-12b", "video_fps": 1}, "model 'gemma4-12b' does not support video_fps"),
    ({"model": "nemotron-3-nano-omni-30b", "video_fps": 0},
     "video_fps: video_fps must be a number above 0."),
    ({"model": "qwen3.8-27b", "video_fps": "20"}, "video_fps: A valid number is required."),
    ({"model": "qwen3.8-27b", "data_residency": "mars"},
     'data_residency: "mars" is not a valid choice.'),
]


@pytest.mark.parametrize("body,message", UNPROCESSABLE)
def test_unprocessable_submits_are_422_and_create_nothing(api: APIClient, ready: Input,
                                                          body: dict[str, Any],
                                                          message: str) -> None:
    response = submit(api, {"input_id": str(ready.pk), **body})
    assert response.status_code == 422, response.content
    assert response.json()["detail"] == message
    assert not Job.objects.exists()


@pytest.mark.parametrize("body", [
    {"model": "laya"},
    {"model": "laya", "input_id": "x", "input_s3_uri": "s3://y"},
])
def test_exactly_one_of_input_id_and_input_s3_uri(api: APIClient, body: dict[str, Any]) -> None:
    response = submit(api, body)
    assert (response.status_code, response.json()["detail"]) == (
        422, "Give exactly one of input_id / input_s3_uri.")


def test_a_missing_model_is_422(api: APIClient, ready: Input) -> None:
    response = submit(api, {"input_id": str(ready.pk)})
    assert (response.status_code, response.json()["detail"]) == (
        422, "model: This field is required.")


@pytest.mark.parametrize("response_format,message", [
    ({"type": "text"}, "response_format.type must be json_schema or json_object, not 'text'."),
    ("json", "response_format must be an object with a type."),
    ({"type": "json_schema", "json_schema": {"name": "x"}},
     "response_format of type json_schema needs an object at "
     "response_format.json_schema.schema."),
])
def test_a_malformed_response_format_is_400(api: APIClient, ready: Input,
                                            response_format: Any, message: str) -> None:
    response = submit(api, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                            "response_format": response_format})
    assert (response.status_code, response.json()["detail"]) == (400, message)
    assert not Job.objects.exists()


def test_an_unsatisfiable_but_well_formed_schema_reaches_the_model(api: APIClient,
                                                                  ready: Input) -> None:
    odd = {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}
    response = submit(api, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                            "response_format": odd})
    assert response.status_code == 200


def test_a_well_formed_response_format_is_kept(api: APIClient, ready: Input) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}}}}
    response = submit(api, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                            "response_format": schema})
    assert Job.objects.get(pk=response.json()["id"]).response_format == schema


def test_the_decision_model_takes_jsonl_only(api: APIClient, organization: Organization) -> None:
    parquet = input_ready(organization, b"PAR1" + b"\0" * 8 + b"PAR1", fmt="parquet")
    response = submit(api, {"input_id": str(parquet.pk), "model": "laya"})
    assert (response.status_code, response.json()["detail"]) == (
        422, "'laya' takes JSONL input only; this input is parquet.")


def test_an_input_not_ready_is_409(api: APIClient, organization: Organization) -> None:
    created = api.post("/batch/v1/inputs", {"format": "jsonl"}, format="json").json()
    response = submit(api, {"input_id": created["id"], "model": "laya"})
    assert response.status_code == 409
    assert response.json()["detail"] == ("The input is awaiting_upload, not ready: wait for "
                                         "it to be ready, then submit.")


@pytest.mark.parametrize("status", ["pending", "copying"])
def test_an_ingest_still_copying_is_409(api: APIClient, ready: Input, status: str) -> None:
    Input.objects.filter(pk=ready.pk).update(status=status)
    response = submit(api, {"input_id": str(ready.pk), "model": "laya"})
    assert (response.status_code, response.json()["detail"]) == (
        409, f"The input is {status}, not ready: wait for it to be ready, then submit.")


def test_an_expired_input_is_410(api: APIClient, ready: Input) -> None:
    # The reference: "the input reports expired and a submit against it is refused - create
    # a new input instead". It will never be ready (409 is for "not ready yet"): its file
    # is gone, as a purged result's is (410).
    Input.objects.filter(pk=ready.pk).update(status="expired")
    response = submit(api, {"input_id": str(ready.pk), "model": "laya"})
    assert response.status_code == 410
    assert response.json()["detail"] == (
        "The input has expired and its file is deleted (an upload is kept 7 days, an upload "
        "window open about an hour): create a new input.")
    assert not Job.objects.exists()


@pytest.mark.parametrize("content,fmt,why", [
    (b"custom_id,prompt\nrow-1,Say hello in French.\n", "jsonl",
     "the file is not JSONL: its first line is not a JSON object"),
    (b'["not", "an object"]\n', "jsonl",
     "the file is not JSONL: its first line is not a JSON object"),
    (b'{"custom_id": "row-1"}\n', "parquet",
     "the file is not parquet: it does not start with the PAR1 magic bytes"),
])
def test_a_file_that_is_not_its_format_is_400_at_submit(api: APIClient, content: bytes,
                                                        fmt: str, why: str) -> None:
    # Errors, 400: "a file that is not JSONL". It will never be ready, so not a 409.
    input_id = uploaded(api, content, fmt)
    response = submit(api, {"input_id": input_id, "model": "gemma4-12b"})
    assert (response.status_code, response.json()["detail"]) == (
        400, f"The input failed - {why}. Create a new input.")
    assert not Job.objects.exists()
    assert api.get(f"/batch/v1/inputs/{input_id}").json()["status"] == "failed"


def test_an_ingest_whose_copy_failed_is_400_with_its_reason(api: APIClient,
                                                           ready: Input) -> None:
    Input.objects.filter(pk=ready.pk).update(status="failed",
                                             error="The source answered HTTP 404.")
    response = submit(api, {"input_id": str(ready.pk), "model": "laya"})
    assert (response.status_code, response.json()["detail"]) == (
        400, "The input failed - the source answered HTTP 404. Create a new input.")


def test_an_upload_that_landed_is_settled_by_the_submit(api: APIClient,
                                                        organization: Organization) -> None:
    from jobs.storage import storage_for

    created = api.post("/batch/v1/inputs", {"format": "jsonl"}, format="json").json()
    key = Input.objects.get(pk=created["id"]).object_key
    storage_for("world").write_stream(key, iter([CHAT_ROW]), max_bytes=1000)
    assert submit(api, {"input_id": created["id"], "model": "laya"}).status_code == 200


def test_another_organizations_input_is_404(api: APIClient) -> None:
    theirs = input_ready(organization_make(), CHAT_ROW)
    for body in ({"input_id": str(theirs.pk)}, {"input_s3_uri": theirs.input_s3_uri}):
        response = submit(api, {**body, "model": "laya"})
        assert (response.status_code, response.json()) == (404, {"detail": "Input not found"})


def test_no_credits_is_402(settings: Settings, client_for) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    item = input_ready(organization, CHAT_ROW)
    _key, plaintext = api_key_make(organization)
    response = submit(client_for(plaintext), {"input_id": str(item.pk), "model": "laya"})
    assert response.status_code == 402
    assert not Job.objects.exists()


@pytest.fixture
def broke(settings: Settings, client_for) -> APIClient:  # type: ignore[no-untyped-def]
    """A key of an organization whose balance is zero."""
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    assert credits_summary(organization=organization).balance == 0
    return client_for(api_key_make(organization)[1])


def test_no_credits_is_402_before_the_input_is_looked_at(broke: APIClient) -> None:
    # "A credit balance of zero or below answers 402, before any of your input is read".
    pending = broke.post("/batch/v1/inputs", {"format": "jsonl"}, format="json")
    assert pending.status_code == 402  # no upload target for it either
    theirs = input_ready(organization_make(), CHAT_ROW)
    for body in ({"input_id": "00000000-0000-0000-0000-000000000000"},
                 {"input_id": "not-even-a-uuid"},
                 {"input_s3_uri": "s3://anex-local-world/inputs/nowhere.jsonl"},
                 {"input_id": str(theirs.pk)}):
        response = submit(broke, {**body, "model": "laya"})
        assert response.status_code == 402, (body, response.content)
        assert "balance is zero or below" in response.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.parametrize("body,status", [
    ({}, 422),  # no model: the body's shape
    ({"model": "gpt-4"}, 422),  # an unknown model
    ({"model": "qwen3-embedding-8b", "max_output_tokens": 10}, 422),  # a field rule
    ({"model": "qwen3.8-27b", "response_format": {"type": "text"}}, 400),
    ({"model": "laya", "data_residency": "eu"}, 403),
])
def test_the_request_itself_is_judged_before_the_balance(broke: APIClient,
                                                        body: dict[str, Any],
                                                        status: int) -> None:
    response = submit(broke, {"input_id": "00000000-0000-0000-0000-000000000000", **body})
    assert response.status_code == status, response.content


def test_eu_without_routing_is_403(api: APIClient, ready: Input) -> None:
    response = submit(api, {"input_id": str(ready.pk), "model": "laya", "data_residency": "eu"})
    assert response.status_code == 403


def test_a_job_must_match_its_inputs_region(client_for) -> None:  # type: ignore[no-untyped-def]
    organization = organization_make(eu_data_routing=True)
    eu_input = input_ready(organization, CHAT_ROW, residency="eu")
    _key, plaintext = api_key_make(organization)
    api = client_for(plaintext)
    mismatch = submit(api, {"input_id": str(eu_input.pk), "model": "laya",
                            "data_residency": "world"})
    assert (mismatch.status_code, mismatch.json()["detail"]) == (
        422, "The input is stored in the eu region and the job asks for world: a job's "
             "data_residency must match its input's.")
    wrong_host = submit(api, {"input_id": str(eu_input.pk), "model": "laya"})
    assert wrong_host.status_code == 421
    assert wrong_host.json() == {
        "detail": "this job is stored in the EU region; use https://api-eu.anex.sh",
        "residency": "eu", "api": "https://api-eu.anex.sh"}
    right_host = submit(api, {"input_id": str(eu_input.pk), "model": "laya"},
                        HTTP_HOST="api-eu.anex.sh")
    assert right_host.status_code == 200
    # Either region's API answers the poll.
    assert api.get(f"{JOBS}/{right_host.json()['id']}").status_code == 200


def test_the_approval_queue_holds_ten(api: APIClient, ready: Input,
                                      organization: Organization) -> None:
    for status in [JobStatus.SUBMITTED, JobStatus.ESTIMATING] + [JobStatus.COST_READY] * 8:
        job_make(organization, status=status)
    job_make(organization, status=JobStatus.IN_PROGRESS)  # not awaiting approval
    response = submit(api, {"input_id": str(ready.pk), "model": "laya"})
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert "approval queue" in response.json()["detail"]
    assert "error" not in response.json()  # the rate limit's code is not this one
    assert Job.objects.count() == 11


def test_a_model_outside_the_keys_scope_reads_as_unknown(client_for,  # type: ignore[no-untyped-def]
                                                         organization: Organization,
                                                         ready: Input) -> None:
    _key, plaintext = api_key_make(organization, model_scopes=["laya"])
    api = client_for(plaintext)
    assert submit(api, {"input_id": str(ready.pk), "model": "laya"}).status_code == 200
    refused = submit(api, {"input_id": str(ready.pk), "model": "gemma4-12b"})
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("Unknown model 'gemma4-12b'")


def test_submitting_is_audited_with_its_key(api: APIClient, api_key: ApiKey,
                                            ready: Input) -> None:
    from console.models import AuditEvent

    job_id = submit(api, {"input_id": str(ready.pk), "model": "laya"}).json()["id"]
    assert AuditEvent.objects.get(action="job.submitted", target_id=job_id).actor_key == api_key
