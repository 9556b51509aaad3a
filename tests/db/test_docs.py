"""Docs pages render from docs/*.md and answer Accept: text/markdown with their Markdown."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

from anex.docs import wants_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs"
pytestmark = pytest.mark.django_db


def test_the_index_is_html_by_default() -> None:
    response = Client().get("/docs/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert "<h1" in response.content.decode()
    assert "Base URL and authentication" in response.content.decode()
    assert "Accept" in response["Vary"]


@pytest.mark.parametrize("path,source", [("/docs/", "index.md"), ("/docs/errors", "errors.md")])
def test_every_page_answers_markdown_when_asked(path: str, source: str) -> None:
    response = Client().get(path, HTTP_ACCEPT="text/markdown")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response.content.decode() == (DOCS / source).read_text(encoding="utf-8")


def test_every_docs_file_is_served_both_ways() -> None:
    client = Client()
    for source in DOCS.glob("*.md"):
        path = "/docs/" if source.stem == "index" else f"/docs/{source.stem}"
        assert client.get(path).status_code == 200, path
        assert client.get(path, HTTP_ACCEPT="text/markdown").content.decode() == \
            source.read_text(encoding="utf-8")


def test_a_md_suffix_is_markdown_too() -> None:
    response = Client().get("/docs/errors.md")
    assert response["Content-Type"].startswith("text/markdown")


def test_an_unknown_page_is_404() -> None:
    assert Client().get("/docs/no-such-page").status_code == 404
    assert Client().get("/docs/..%2Fsettings").status_code == 404


@pytest.mark.parametrize("accept,expected", [
    ("text/markdown", True),
    ("text/markdown, text/html;q=0.9", True),
    ("text/html, text/markdown;q=0.5", False),
    ("text/html,application/xhtml+xml,*/*;q=0.8", False),
    ("text/markdown;q=0", False),
    ("", False),
])
def test_accept_negotiation(accept: str, expected: bool) -> None:
    assert wants_markdown(accept) is expected
