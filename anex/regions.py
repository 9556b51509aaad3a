"""Data residency (docs/decisions.md, "Data residency"; the reference's 403 and 421).

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

from anex.api.errors import ApiError


class Region(models.TextChoices):
    """Where an object's data is stored and processed (docs/decisions.md, "Data residency")."""

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


def residency_resolve(*, organization: Residing, requested: str | None) -> Region:
    """The region a new input or job lives in: the request's choice, else the org default.

    Asking for "eu" without EU data routing is the reference's 403.
    """
    if requested is None:
        return Region.EU if organization.eu_data_routing else Region.WORLD
    region = Region(requested)
    if region == Region.EU and not organization.eu_data_routing:
        raise ApiError(403, EU_ROUTING_DISABLED_DETAIL)
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
    raise ApiError(
        421, f"this {noun} is stored in {where}; use {origin}",
        extra={"residency": region.value, "api": origin},
    )
