"""The docs pages under /docs/: the customer pages, rendered from their Markdown in docs/.

Only the pages PAGES names are served: docs/ also holds what customers do not read (the
operators' docs/deploy.md; docs/dev/, the developers' architecture, style guide and
decision records, which quote internal profiling and hardening), and no file there is
published by being there. Every page answers `Accept: text/markdown` (or a `.md` suffix)
with its Markdown source, and HTML otherwise (the reference's overview: "Every page of
these docs also answers Accept: text/markdown with a Markdown rendering of itself").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import markdown
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.module_loading import import_string
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

DOCS_DIR = Path(settings.BASE_DIR) / "docs"
MARKDOWN_TYPE = "text/markdown"

# The customer pages, each docs/<slug>.md: adding one is a line here (the index links it).
PAGES = (
    "index",
    "estimates",
    "output-format",
    "media",
    "webhooks",
    "errors",
    "realtime",
    "openai",
    "cli",
)


@dataclass(frozen=True)
class DocPage:
    slug: str
    title: str
    source: str
    html: SafeString


def _title_of(source: str, slug: str) -> str:
    for line in source.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return slug.replace("-", " ").capitalize()


@lru_cache(maxsize=128)
def _render(path: Path, mtime_ns: int) -> DocPage:
    # Keyed by mtime so an edited page is re-rendered without a restart.
    return _page(path.stem, path.read_text(encoding="utf-8"))


# Pages generated from data rather than written: slug -> a function returning Markdown.
GENERATED_PAGES = {"pricing": "anex.docs.pricing_markdown"}


@lru_cache(maxsize=16)
def _generated(slug: str) -> DocPage:
    source = import_string(GENERATED_PAGES[slug])()
    return _page(slug, source)


def _page(slug: str, source: str) -> DocPage:
    html = markdown.markdown(source, extensions=["tables", "fenced_code", "toc"])
    # The Markdown is ours (the repository's files, the catalog), never a customer's.
    return DocPage(slug=slug, title=_title_of(source, slug), source=source,
                   html=mark_safe(html))  # noqa: S308


def doc_page(slug: str) -> DocPage:
    if slug in GENERATED_PAGES:
        return _generated(slug)
    if slug not in PAGES:
        raise Http404("No such docs page.")
    path = DOCS_DIR / f"{slug}.md"
    return _render(path, path.stat().st_mtime_ns)


def doc_pages() -> list[DocPage]:
    pages = [doc_page(slug) for slug in (*PAGES, *GENERATED_PAGES)]
    return sorted(pages, key=lambda page: (page.slug != "index", page.slug))


def wants_markdown(accept: str) -> bool:
    """True when the Accept header ranks text/markdown at least as high as text/html."""
    weights: dict[str, float] = {}
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        weights[media.lower()] = quality
    markdown_q = weights.get(MARKDOWN_TYPE, 0.0)
    return markdown_q > 0 and markdown_q >= weights.get("text/html", 0.0)


@require_GET
@vary_on_headers("Accept")
def docs_page(request: HttpRequest, slug: str = "index", suffix: str = "") -> HttpResponse:
    page = doc_page(slug)
    if suffix == ".md" or wants_markdown(request.headers.get("Accept", "")):
        return HttpResponse(page.source, content_type=f"{MARKDOWN_TYPE}; charset=utf-8")
    return render(request, "docs/page.html", {"page": page, "pages": doc_pages()})


def pricing_markdown() -> str:
    """The /docs/pricing page, generated from the catalog so it can never drift from it."""
    from inference.catalog import catalog, catalog_tiers
    from inference.kinds import kind_for, kinds_all

    models = list(catalog().values())
    lines = [
        "# Pricing",
        "",
        "Prices are in US dollars. 1 credit = 1 US cent. Per-token prices are exact decimals;",
        "a job's charge is its exact cost rounded up to a whole credit, at least 1 credit when",
        "it did any work, and at least the model's minimum job price (the cost of the machine",
        "start a small job forces - never added on top of a job whose token price clears it).",
        "A job that consumed nothing is not charged. Approval holds the estimate",
        "(`est_cost_cents`); the final charge settles against that hold and never exceeds it,",
        "and the rest is released - on done, failed and cancelled jobs alike.",
        "",
    ]
    # Each kind of model prices its own rows: one section each, in the kinds' order.
    for kind in kinds_all():
        lines += kind.pricing_section([m for m in models if kind_for(m) is kind])
        lines.append("")
    lines += [
        "## Urgency tiers",
        "",
        "A job's `priority` multiplies its exact cost before it is rounded up (the minimum job",
        "price is not multiplied); see [estimates](estimates#urgency-tiers).",
        "",
        "| `priority` | Price multiplier | Completion window |",
        "| --- | --- | --- |",
        *(f"| `{tier.name}` | {tier.multiplier.normalize():f} x | {tier.completion_hours} h |"
          for tier in catalog_tiers().values()),
        "",
    ]
    ceilings = [
        f"{_duration(m.media.audio_max_seconds)} of audio on `{m.id}`"
        for m in models if m.media.audio_max_seconds
    ]
    lines += [
        "## Audio and video durations",
        "",
        "Declare `duration_seconds` on a clip and it is checked and billed at exactly that",
        "length. Undeclared, a clip whose container states its length is read exactly, one we",
        "can size is estimated from its bytes at a conservative bitrate, and a hosted clip we",
        "cannot size is billed at the model's full duration ceiling: "
        + ", ".join(ceilings) + ".",
        "",
    ]
    return "\n".join(lines)


def _duration(seconds: int) -> str:
    return f"{seconds // 60} minutes" if seconds >= 60 and seconds % 60 == 0 else f"{seconds} s"
