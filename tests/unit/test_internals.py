"""The shortcuts into the frameworks' internals (anex/internals) run only on the release
series they were verified on: the installed frameworks and pyproject.toml's ranges are
both held to anex.internals.VERIFIED, so an upgrade fails here until each shortcut is
verified again; and no module outside the fence imports a framework's private names."""

from __future__ import annotations

import ast
import tomllib
from importlib.metadata import version

from packaging.requirements import Requirement
from packaging.version import Version

from anex.internals import VERIFIED
from tests.product import ROOT, product_trees, relative

FENCE = "anex/internals/"


def _series(release: str) -> str:
    parsed = Version(release)
    return f"{parsed.major}.{parsed.minor}"


def test_the_installed_frameworks_are_the_series_the_shortcuts_were_verified_on() -> None:
    installed = {name: _series(version(name)) for name in VERIFIED}
    assert installed == VERIFIED, (
        "a framework anex/internals leans on changed series: verify each shortcut there "
        "against it, then update VERIFIED")


def test_pyproject_allows_only_the_verified_series() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"]
    allowed = {}
    for line in dependencies:
        requirement = Requirement(line)
        if requirement.name in VERIFIED:
            allowed[requirement.name] = requirement.specifier
    assert set(allowed) == set(VERIFIED)
    for name, series in VERIFIED.items():
        low = Version(f"{series}.0")
        major, minor = (int(part) for part in series.split("."))
        assert low in allowed[name], f"{name} {allowed[name]} leaves out {series}"
        assert Version(f"{major}.{minor + 1}.0") not in allowed[name], (
            f"{name} {allowed[name]} admits a series after {series}")
        assert Version(f"{major}.{minor - 1}.99") not in allowed[name] if minor else True, (
            f"{name} {allowed[name]} admits a series before {series}")


def test_no_module_outside_the_fence_imports_a_frameworks_private_name() -> None:
    private = []
    for name, tree in product_trees():
        if name.startswith(FENCE) or "/migrations/" in name:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[
                    0] in ("django", "rest_framework", "dramatiq"):
                private += [f"{name}: {node.module}.{alias.name}" for alias in node.names
                            if alias.name.startswith("_")]
    assert not private, f"framework internals outside {FENCE}: {private}"


def test_the_fence_is_where_the_shortcuts_are() -> None:
    modules = {relative(path) for path in (ROOT / "anex" / "internals").glob("*.py")}
    assert modules == {f"{FENCE}{name}.py" for name in (
        "__init__", "prepared", "lean", "prototyped", "doorbell")}
