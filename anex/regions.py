"""Data residency (docs/dev/decisions/2026-12-01-data-residency.md; the reference's 403 and 421).

One deployment answers both API hosts. The host a request reached is its region; data
kept in the other region is refused with 421 naming the API to use.
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models
from django.http import HttpRequest
from django.http.request import split_domain_port

from anex.errors import Forbidden, WrongRegion


class Region(models.TextChoices):
    """Where an object's data is stored and processed
    (docs/dev/decisions/2026-12-01-data-residency.md)."""

    WORLD = "world", "World"
    EU = "eu", "EU (EEA)"


class Residing(Protocol):
    """What residency reads of an organization (console.models.Organization)."""

    eu_data_routing: bool


EU_ROUTING_DISABLED_DETAIL = (
    "EU data routing is not enabled for this organization. Contact us to enable it."
)


def region_origin(region: Region | str) -> str:
    return settings.ANEX_EU_API_ORIGIN if region == Region.EU else settings.ANEX_API_ORIGIN


def request_region(request: HttpRequest) -> Region:
    host, _port = split_domain_port(request.get_host())
    if host.strip("[]") == (urlsplit(settings.ANEX_EU_API_ORIGIN).hostname or ""):
        return Region.EU
    return Region.WORLD


def organization_region(organization: Residing) -> Region:
    """Where an organization's data lives unless a request asks otherwise."""
    return Region.EU if organization.eu_data_routing else Region.WORLD


def eu_routing_require(organization: Residing) -> None:
    """The reference's 403: the EU region, asked for by a batch request's data_residency or
    by reaching the EU realtime host, is only for an organization with EU data routing."""
    if not organization.eu_data_routing:
        raise Forbidden(EU_ROUTING_DISABLED_DETAIL)


def residency_resolve(*, organization: Residing, requested: str | None) -> Region:
    """The region a new input or job lives in: the request's choice, else the org default.

    Asking for "eu" without EU data routing is the reference's 403.
    """
    if requested is None:
        return organization_region(organization)
    region = Region(requested)
    if region == Region.EU:
        eu_routing_require(organization)
    return region


def region_require(request: HttpRequest, *, residency: Region | str, noun: str) -> None:
    """Refuse with 421 when `residency` data is asked of the other region's host."""
    region_check(host_region=request_region(request), residency=residency, noun=noun)


def region_check(*, host_region: Region, residency: Region | str, noun: str) -> None:
    if host_region == residency:
        return
    region = Region(residency)
    origin = region_origin(region)
    where = "the EU region" if region == Region.EU else "the world region"
    raise WrongRegion(f"this {noun} is stored in {where}; use {origin}",
                      residency=region.value, api=origin)
