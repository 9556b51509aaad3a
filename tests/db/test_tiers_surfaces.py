"""Issue 44 item 2 on the surfaces beside the batch API: the OpenAI-compatible batches
(completion_window 24h is standard, 72h flex, metadata anex_priority names the tier over
either; a batch expires at its own window) and `anex submit --priority`, each against a
live test server (docs/openai.md, docs/cli.md)."""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.utils import timezone

from anex import cli
from console.models import Organization
from inference.catalog import model_get
from inference.pricing import price, usage_cost_usd
from jobs.constants import JobStatus, Priority
from jobs.models import Job
from openai_api.batches import batch_priority, batches_expire
from openai_api.models import OpenAIBatch
from tests.db.test_cli import anex  # noqa: F401  (the fixture)
from tests.db.test_openai_batches import (  # noqa: F401  (fixtures)
    EMBED,
    client,
    estimated,
    estimates,
    jsonl,
    line,
    served,
    tenant,
    uploaded,
)

if TYPE_CHECKING:
    from openai import OpenAI

pytestmark = pytest.mark.django_db(transaction=True)


# --- the OpenAI surface ---------------------------------------------------------------------


def test_the_window_maps_to_a_tier_and_metadata_names_one_over_it() -> None:
    assert batch_priority("24h", None) == Priority.STANDARD
    assert batch_priority("72h", {"team": "x"}) == Priority.FLEX
    assert batch_priority("24h", {"anex_priority": "priority"}) == Priority.PRIORITY
    assert batch_priority("72h", {"anex_priority": "standard"}) == Priority.STANDARD


@pytest.mark.parametrize("window,metadata,tier", [
    ("24h", None, "standard"),
    ("72h", None, "flex"),
    ("24h", {"anex_priority": "priority"}, "priority"),
    ("72h", {"anex_priority": "standard", "team": "search"}, "standard"),
])
def test_a_batch_runs_in_its_tier_at_its_price(client: OpenAI, estimates: list[str],  # noqa: F811
                                               window: str, metadata: dict[str, str] | None,
                                               tier: str) -> None:
    file_id = uploaded(client, jsonl(*(line(f"r{i}", text="a plain text string " * 500)
                                       for i in range(20))))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window=window,  # type: ignore[arg-type]
                                  metadata=metadata)
    hours = 72 if window == "72h" else 24
    assert (batch.completion_window, batch.expires_at) == (window,
                                                           batch.created_at + hours * 3600)
    job = estimated(batch.id)
    assert job.priority == tier
    model = model_get(EMBED)
    assert model is not None
    from inference.pricing import Usage

    usage = Usage(input_tokens=job.est_input_tok or 0)
    exact = usage_cost_usd(model, usage) * {"flex": Decimal("0.5"), "standard": Decimal(1),
                                            "priority": Decimal("1.75")}[tier]
    assert job.est_cost_cents == price(model, usage, tier).cents == max(
        math.ceil(exact * 100), 1)


def test_another_window_or_an_unknown_tier_is_400(client: OpenAI) -> None:  # noqa: F811
    import openai

    file_id = uploaded(client, jsonl(line("r1")))
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                              completion_window="48h")  # type: ignore[arg-type]
    assert refused.value.message.endswith(
        "completion_window: completion_window must be '24h' or '72h' (72h: the flex tier, half "
        "price; docs/openai.md).")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                              completion_window="24h", metadata={"anex_priority": "urgent"})
    assert refused.value.message.endswith(
        "metadata.anex_priority must be one of flex, standard, priority; got 'urgent'.")
    assert not OpenAIBatch.objects.exists() and not Job.objects.exists()


def test_a_72h_batch_expires_at_72_hours_not_24(client: OpenAI, estimates: list[str]  # noqa: F811
                                                ) -> None:
    ids = {}
    for window in ("24h", "72h"):
        file_id = uploaded(client, jsonl(line("r1")))
        ids[window] = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                            completion_window=window).id  # type: ignore[arg-type]
    OpenAIBatch.objects.update(created_at=timezone.now() - timedelta(hours=25))
    assert batches_expire() == 1
    assert OpenAIBatch.objects.get(pk=ids["24h"]).expired_at is not None
    assert OpenAIBatch.objects.get(pk=ids["72h"]).expired_at is None
    OpenAIBatch.objects.filter(pk=ids["72h"]).update(
        created_at=timezone.now() - timedelta(hours=72, minutes=1))
    assert batches_expire() == 1
    assert OpenAIBatch.objects.get(pk=ids["72h"]).expired_at is not None


# --- the CLI --------------------------------------------------------------------------------


def test_anex_submit_priority_sends_the_tier_and_shows_its_window(
        anex: Any, organization: Organization, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    def estimated_now(api: Any, job_id: str, *, quiet: bool) -> dict[str, Any]:
        # The estimate worker's part, done here: the job priced and waiting approval.
        Job.objects.filter(pk=job_id).update(status=JobStatus.COST_READY, est_cost_cents=7,
                                             row_count=1)
        return dict(api.call("GET", f"/jobs/{job_id}"))

    monkeypatch.setattr(cli, "wait_estimate", estimated_now)
    monkeypatch.setattr("sys.stdin", open("/dev/null"))
    source = tmp_path / "rows.jsonl"
    source.write_bytes(b'{"custom_id": "a", "body": {"input": "x"}}\n')
    code, out, err = anex("submit", str(source), "--model", EMBED, "--priority", "flex")
    assert code == cli.EXIT_NOT_APPROVED, err
    job = Job.objects.get()
    assert job.priority == Priority.FLEX
    assert "priority:  flex, within 72 h of approval" in out + err
    code, _, err = anex("submit", str(source), "--model", EMBED, "--priority", "urgent")
    assert code == 2 and "invalid choice: 'urgent'" in err
    code, _, _ = anex("submit", str(source), "--model", EMBED)
    assert code == cli.EXIT_NOT_APPROVED
    assert Job.objects.exclude(pk=job.pk).get().priority == Priority.STANDARD
