"""Pricing reproduces the reference's published figures, from the one catalog."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from inference.catalog import catalog, model_get
from inference.pricing import Usage, clip_seconds_billed, price, usage_cost_usd

M = 1_000_000
REFERENCE_MODELS = {"qwen3.8-27b", "nemotron-3-nano-omni-30b", "gemma4-12b",
                    "qwen3-embedding-8b", "qwen3-vl-embedding-8b", "qwen3-vl-embedding-2b",
                    "laya"}


def model(model_id: str):  # type: ignore[no-untyped-def]
    found = model_get(model_id)
    assert found is not None
    return found


def test_every_reference_model_is_in_the_catalog() -> None:
    assert set(catalog()) == REFERENCE_MODELS


def test_qwen3_embedding_8b_is_three_cents_per_million_tokens() -> None:
    # "qwen3-embedding-8b bills $0.03 per 1M input tokens (0.003 cents per 1k)"
    m = model("qwen3-embedding-8b")
    assert usage_cost_usd(m, Usage(input_tokens=M)) == Decimal("0.03")
    assert usage_cost_usd(m, Usage(input_tokens=1000)) * 100 == Decimal("0.003")
    assert price(m, Usage(input_tokens=M)).cents == 3


@pytest.mark.parametrize("model_id,text,media", [
    # "Embedding jobs", which wins over the models table
    # (docs/dev/decisions/2026-12-01-models-limits-and-pricing.md): "$0.03 per 1M input tokens on
    # text-only rows and $0.08 on rows carrying any media", "$0.007 and $0.02".
    ("qwen3-vl-embedding-8b", "0.03", "0.08"),
    ("qwen3-vl-embedding-2b", "0.007", "0.02"),
])
def test_vl_embedding_rows_are_priced_text_only_or_with_media(model_id: str, text: str,
                                                             media: str) -> None:
    m = model(model_id)
    assert usage_cost_usd(m, Usage(input_tokens=M)) == Decimal(text)
    assert usage_cost_usd(m, Usage(media_row_tokens=M)) == Decimal(media)


@pytest.mark.parametrize("model_id,per_million_images,per_million_clips", [
    ("qwen3-vl-embedding-8b", "4", "60"),
    ("qwen3-vl-embedding-2b", "2", "20"),
])
def test_vl_embedding_flat_charges_per_item(model_id: str, per_million_images: str,
                                            per_million_clips: str) -> None:
    m = model(model_id)
    assert usage_cost_usd(m, Usage(images=M)) == Decimal(per_million_images)
    assert usage_cost_usd(m, Usage(clips=M)) == Decimal(per_million_clips)


def test_the_decision_model_bills_half_a_cent_per_million_input_tokens() -> None:
    # "$0.005 per 1M (0.0005 cents per 1k)"
    m = model("laya")
    assert usage_cost_usd(m, Usage(input_tokens=M)) == Decimal("0.005")
    assert usage_cost_usd(m, Usage(input_tokens=1000)) * 100 == Decimal("0.0005")
    assert m.price.output_per_mtok == 0


def test_the_decision_model_minimum_job_price_is_five_cents() -> None:
    m = model("laya")
    # A small job pays the minimum...
    assert price(m, Usage(input_tokens=3_000)).cents == 5
    # ...and a large one pure token rates: the minimum is never added on top.
    assert price(m, Usage(input_tokens=40 * M)).cents == 20


def test_a_job_that_did_any_work_costs_at_least_one_credit() -> None:
    m = model("qwen3-embedding-8b")
    tiny = price(m, Usage(input_tokens=12))
    assert tiny.exact_usd == Decimal("0.00000036") and tiny.cents == 1


def test_a_job_that_consumed_nothing_is_not_charged() -> None:
    assert price(model("laya"), Usage()).cents == 0


def test_charges_round_up_to_a_whole_credit() -> None:
    m = model("qwen3-embedding-8b")
    assert price(m, Usage(input_tokens=M + 1)).cents == 4


def test_an_undeclared_hosted_clip_on_nemotron_is_priced_as_40_minutes() -> None:
    m = model("nemotron-3-nano-omni-30b")
    billed = clip_seconds_billed(m, "audio")
    assert billed == 40 * 60
    declared = clip_seconds_billed(m, "audio", declared=Decimal(20))
    assert declared == 20
    surcharge = m.price.per_media_minute
    undeclared_cost = usage_cost_usd(m, Usage(clips=1, media_seconds=billed))
    declared_cost = usage_cost_usd(m, Usage(clips=1, media_seconds=declared))
    assert undeclared_cost == Decimal("0.08002")  # 40 minutes at $0.002, plus the clip
    expected_difference = Decimal(2400 - 20) * surcharge / 60
    assert abs((undeclared_cost - declared_cost) - expected_difference) < Decimal("1e-20")
    assert price(m, Usage(clips=1, media_seconds=billed)).cents == 10  # the minimum job
    assert price(m, Usage(clips=1, media_seconds=billed, input_tokens=30_000 * 50)).cents == 24


def test_a_measured_length_wins_over_the_ceiling_and_a_declared_one_over_both() -> None:
    m = model("gemma4-12b")
    assert clip_seconds_billed(m, "audio") == 30
    assert clip_seconds_billed(m, "audio", measured=Decimal("12.5")) == Decimal("12.5")
    assert clip_seconds_billed(m, "audio", declared=Decimal(7), measured=Decimal(9)) == 7


def test_chat_usage_adds_media_tokens_output_and_per_clip_charges() -> None:
    m = model("qwen3.8-27b")
    usage = Usage(input_tokens=M, media_tokens=M, output_tokens=M, clips=1,
                  media_seconds=Decimal(60))
    expected = (m.price.input_per_mtok + m.price.media_input_per_mtok  # type: ignore[operator]
                + m.price.output_per_mtok + m.price.per_clip + m.price.per_media_minute)
    assert usage_cost_usd(m, usage) == expected


def test_usage_adds_up() -> None:
    total = Usage(input_tokens=1, images=2) + Usage(input_tokens=3, media_seconds=Decimal(5))
    assert total == Usage(input_tokens=4, images=2, media_seconds=Decimal(5))


@pytest.mark.django_db
def test_the_pricing_page_is_generated_from_the_catalog() -> None:
    page = Client().get("/docs/pricing", HTTP_ACCEPT="text/markdown").content.decode()
    assert "| `qwen3-embedding-8b` | $0.03 |" in page
    assert "| `laya` | $0.005 | $0.01 | $0.05 |" in page
    assert "| `qwen3-vl-embedding-8b` | $0.03 | $0.08 | $4.00 | $60.00 |" in page
    assert "| `qwen3-vl-embedding-2b` | $0.007 | $0.02 | $2.00 | $20.00 |" in page
    assert "40 minutes of audio on `nemotron-3-nano-omni-30b`" in page
    html = Client().get("/docs/pricing")
    assert html.status_code == 200 and "<table>" in html.content.decode()
