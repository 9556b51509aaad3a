"""Docs pages render from docs/*.md and answer Accept: text/markdown with their Markdown;
only the customer pages are served."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from anex.docs import GENERATED_PAGES, PAGES, wants_markdown

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


def test_every_customer_page_is_served_both_ways() -> None:
    client = Client()
    for slug in PAGES:
        source = DOCS / f"{slug}.md"
        path = "/docs/" if slug == "index" else f"/docs/{slug}"
        assert client.get(path).status_code == 200, path
        assert client.get(path, HTTP_ACCEPT="text/markdown").content.decode() == \
            source.read_text(encoding="utf-8")


# What docs/ holds for the people who run and build anex, never served: the operators'
# guide at the top, the developers' notes (architecture, style, decision records) in dev/.
NOT_SERVED = {"deploy"}


def test_a_docs_file_is_a_customer_page_or_named_as_not_one() -> None:
    # A page added to docs/ is not published by being there, nor forgotten: it is listed
    # in anex.docs.PAGES or here.
    assert {source.stem for source in DOCS.glob("*.md")} == set(PAGES) | NOT_SERVED


@pytest.mark.parametrize("path", [
    "/docs/decisions", "/docs/architecture", "/docs/deploy", "/docs/style", "/docs/dev",
    "/docs/dev/architecture", "/docs/dev/decisions", "/docs/README",
])
def test_developer_and_operator_notes_are_not_served(path: str) -> None:
    client = Client()
    assert client.get(path).status_code == 404
    assert client.get(path, HTTP_ACCEPT="text/markdown").status_code == 404
    assert client.get(f"{path}.md").status_code == 404


def test_the_customer_pages_link_only_served_pages() -> None:
    client = Client()
    served = set(PAGES) | set(GENERATED_PAGES)
    for slug in PAGES:
        text = (DOCS / f"{slug}.md").read_text(encoding="utf-8")
        for linked in re.findall(r"\(/docs/([a-z0-9-]*)(?:#[^)]*)?\)", text):
            assert (linked or "index") in served, (slug, linked)
        assert "docs/dev/" not in text and "decisions.md" not in text, slug
    page = client.get("/docs/").content.decode()
    assert "/docs/decisions" not in page and "/docs/deploy" not in page


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
