"""POST /files: a multipart upload streamed to storage as an anex input, never whole in
memory (the form is read by anex.multipart, as the storage's own upload form is), its
fields before or after the file."""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest

from anex.errors import Invalid, QuotaExceeded, TooLarge
from anex.multipart import FormError, StreamedForm, form_boundary
from anex.regions import Region
from billing.services import organization_lock
from console.actors import Actor
from console.models import Organization
from inference.constants import InputFormat
from jobs.services.inputs import input_admit, input_derived_create
from jobs.services.quota import stored_quota_require, stored_room
from jobs.storage import StorageTooLarge, storage_for
from openai_api.models import FilePurpose, OpenAIFile

PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
FILENAME_CHARS = 255


def _file_chunks(form: StreamedForm) -> Iterator[bytes]:
    """The form's file part, as the chunks storage writes; a form that cannot be read is
    OpenAI's 400."""
    try:
        yield from form.file_chunks()
    except FormError as exc:
        raise Invalid(str(exc)) from None


def _purpose_require(purpose: str | None) -> None:
    if purpose is None:
        raise Invalid("Missing required parameter: 'purpose'.", extra={"param": "purpose"})
    if purpose != FilePurpose.BATCH:
        raise Invalid(f"'{purpose}' is not a purpose this API takes: upload batch input "
                      "files with purpose 'batch'.", extra={"param": "purpose"})


def file_upload(*, organization: Organization, actor: Actor, host_region: Region,
                request: HttpRequest) -> OpenAIFile:
    """Read the form's fields, admit the input as every input is (jobs.services.inputs
    input_admit: residency, the host, the balance), then stream the file to storage under
    the input cap: a ready input, frozen on its bytes, kept 7 days. The fields come in any
    order, as OpenAI takes them: a purpose sent before the file (as the SDK sends it) is
    checked before a byte of the file is stored; one sent after it (`curl -F file=@… -F
    purpose=batch`) once the file has streamed to storage, which a refusal then deletes -
    never held in memory. Its format is checked at its batch's create (input_format_problem
    there), where OpenAI answers a file that is not JSONL."""
    boundary = form_boundary(request.META.get("CONTENT_TYPE", ""))
    if not boundary:
        raise Invalid("Send the file as multipart/form-data with the fields 'purpose' and "
                      "'file'.")
    form = StreamedForm(request, boundary, fields_after_file=True)
    try:
        form.read_fields()
    except FormError as exc:
        raise Invalid(str(exc)) from None
    purpose = form.fields.get("purpose")
    if purpose is not None or not form.file_started:
        _purpose_require(purpose)
    if not form.file_started:
        raise Invalid("Missing required parameter: 'file'.", extra={"param": "file"})
    # What every input is admitted on, before a byte of the file is stored.
    residency = input_admit(organization=organization, host_region=host_region,
                            requested=None)
    filename = (form.file_name or "upload.jsonl")[:FILENAME_CHARS]
    storage = storage_for(residency)
    made: list[str] = []
    cap = settings.ANEX_INPUT_MAX_BYTES
    try:
        # The file streams into the room the organization's stored-input quota has left,
        # and stops there; once stored, its real size is judged again under the lock.
        room = stored_room(organization=organization)
        try:
            with transaction.atomic():
                item = input_derived_create(organization=organization, actor=actor,
                                            fmt=InputFormat.JSONL, residency=residency,
                                            chunks=_file_chunks(form), mode="openai",
                                            max_bytes=room)
                made.append(item.object_key)
                if purpose is None:  # sent after the file: read now, the file stored
                    try:
                        form.read_rest()
                    except FormError as exc:
                        raise Invalid(str(exc)) from None
                    _purpose_require(form.fields.get("purpose"))
                assert item.size_bytes is not None
                organization_lock(organization.pk)
                stored_quota_require(organization=organization, adding_bytes=item.size_bytes,
                                     excluding=item.pk)
                return OpenAIFile.objects.create(organization=organization, input=item,
                                                 purpose=FilePurpose.BATCH, filename=filename,
                                                 bytes=item.size_bytes)
        except StorageTooLarge:
            if room < cap:  # stopped by the quota, not the cap: as it stands now
                stored_quota_require(organization=organization, adding_bytes=room + 1,
                                     cut_short=True)
                raise TooLarge(f"The file is over the {room:,} bytes the organization's "
                               "stored-input quota had room for when it began.") from None
            raise TooLarge(f"The file is over the input cap of {cap:,} bytes.") from None
        except BaseException:
            for key in made:
                storage.delete(key)
            raise
    except QuotaExceeded as refused:
        # OpenAI answers its own organization file-storage limit 400 invalid_request_error
        # (its SDK's BadRequestError, never retried): so does this surface, with the
        # anex API's message
        # (docs/dev/decisions/2026-12-06-stored-inputs-a-quota-per-organization.md).
        raise Invalid(refused.detail, retry_after=refused.retry_after) from None
