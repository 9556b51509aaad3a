"""Issue 41, item 7: the console's New job page says which models take which media, from
the catalog (each model's modalities)."""

from __future__ import annotations

from typing import Any

import pytest

from console.models import Organization
from inference.catalog import catalog
from tests.db.test_console import signed_in

pytestmark = pytest.mark.django_db


def test_the_new_job_page_says_which_models_take_which_media(
        organization: Organization, settings: Any, tokenizer_dir: Any) -> None:
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": tokenizer_dir}
    client, _user = signed_in(organization)
    page = client.get("/console/jobs/new").content.decode()
    # each media model is listed with what it takes, in the list and in its option
    assert "Which models take images, audio or video" in page
    assert "<li><code>gemma4-12b</code>: image, audio, video</li>" in page
    assert "<li><code>qwen3-vl-embedding-8b</code>: image, video</li>" in page
    assert 'data-media="image, audio, video"' in page
    assert "gemma4-12b — chat · text, image, audio, video</option>" in page
    # a text-only model is not in the list and its option says nothing of media
    assert "<code>qwen3-embedding-8b</code>:" not in page
    assert "qwen3-embedding-8b — embeddings</option>" in page
    assert "tiny-qwen3 — chat (local)</option>" in page
    assert page.count("</li>", page.index('id="media-models"')) >= sum(
        1 for model in catalog().values() if model.media_modalities)
    assert 'href="/docs/media"' in page
