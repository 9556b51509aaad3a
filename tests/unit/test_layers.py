"""The layering of docs/dev/architecture.md, held to the code: every module of the product is
on a named floor, and every import (at the top of a module, inside a function, or for types
only) runs down the floors, never up; no two modules import each other at run time, however
indirectly (a type-only import back, under TYPE_CHECKING, is no circle: nothing runs it).
Read from the source, no module imported. The parser is tested on the cases it once got
wrong, so the layering tests cannot pass while it misreads the code."""

from __future__ import annotations

import ast
import fnmatch
import functools
import textwrap
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TypeGuard

import pytest
from django.conf import settings

from tests.product import NOT_PRODUCT, PRODUCT_APPS, ROOT, parsed

# Lowest first. Every module of the product is listed on exactly one floor (a pattern with
# `*` takes a whole package): a new module fails test_every_module_is_on_one_named_floor
# until it is listed here, on the floor docs/dev/architecture.md shows it on.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("anex", "anex.api", "anex.env", "anex.settings", "anex.net", "anex.crypto",
                "anex.db", "anex.redis", "anex.requestid", "anex.logcontext", "anex.broker",
                "anex.regions", "anex.errors", "anex.api.errors", "anex.logsafe",
                "anex.multipart", "anex.internals", "anex.internals.*")),
    ("model facts", ("inference", "inference.apps", "inference.catalog", "inference.constants",
                     "inference.pricing", "inference.response_format",
                     "inference.schema_evaluation", "inference.tokens",
                     "inference.chat_template", "inference.token_pieces",
                     "inference.warmth")),
    ("row rules and engines", ("inference.rows", "inference.rows.*", "inference.engines",
                               "inference.engines.*", "inference.corpus",
                               "inference.checkpoints", "inference.checkpoints_media",
                               "inference.checkpoints_embedding_media",
                               "inference.checkpoints_qwen3_vl")),
    ("task kinds", ("inference.kinds", "inference.kinds.*")),
    ("tenants and money", ("console", "console.apps", "console.models", "console.constants",
                           "console.tenancy", "console.keys", "console.apikeys",
                           "console.actors", "console.audit", "console.accounts",
                           "console.selectors", "console.services", "billing", "billing.apps",
                           "billing.models", "billing.constants", "billing.allocation",
                           "billing.selectors", "billing.services", "billing.stripe_gateway",
                           "billing.unsettled")),
    ("work", ("jobs", "jobs.apps", "jobs.models", "jobs.constants", "jobs.storage",
              "jobs.jsonl", "jobs.jsonl_scan", "jobs.results", "jobs.dispatch",
              "jobs.failures", "jobs.idempotency", "jobs.selectors", "jobs.services",
              "jobs.services.*", "jobs.validation", "jobs.validation.*", "jobs.tasks",
              # The realtime API's work: admission, the requests and their settlement, the
              # engine client and the engine server, the settlement's actor.
              "realtime", "realtime.apps", "realtime.constants", "realtime.models",
              "realtime.selectors", "realtime.checks", "realtime.concurrency",
              "realtime.engine_client", "realtime.serving", "realtime.services",
              "realtime.services.*", "realtime.tasks",
              # The OpenAI-compatible surface's work: its files and batches, its sweep.
              "openai_api", "openai_api.apps", "openai_api.models", "openai_api.batches",
              "openai_api.tasks")),
    ("entry points", (
        # The processes and the web plumbing around every view.
        "anex.apps", "anex.urls", "anex.wsgi", "anex.cli", "anex.devstack", "anex.roles",
        "anex.worker", "anex.workermetrics", "anex.periodic", "anex.gunicorn_hooks",
        "anex.accesslog", "anex.logmask", "anex.csp", "anex.transfers", "anex.admin_site",
        "anex.docs", "anex.health", "anex.metrics",
        "anex.api.authentication", "anex.api.bodylimit", "anex.api.nul",
        "anex.api.parsers", "anex.api.permissions", "anex.api.schema",
        "anex.api.serializers", "anex.api.throttling",
        # Each app's views, serializers and forms, URLs, admin and commands.
        "billing.admin", "billing.urls", "billing.views",
        "console.admin", "console.forms", "console.urls", "console.views", "console.views.*",
        "console.templatetags", "console.templatetags.*", "console.management",
        "console.management.*",
        "inference.management", "inference.management.*",
        "jobs.admin", "jobs.api", "jobs.openapi", "jobs.serializers", "jobs.storage_urls",
        "jobs.storage_views", "jobs.urls",
        # uploads reads its form with the storage stand-in's reader (jobs.storage_views):
        # on the work floor once that reader is off the views (issue 42 item 4).
        "openai_api.api", "openai_api.serializers", "openai_api.urls", "openai_api.uploads",
        "realtime.admin", "realtime.api", "realtime.serializers", "realtime.urls",
        "realtime.management", "realtime.management.*")),
)
# The type-only circles left (TYPE_CHECKING imports back, for the annotations): each stays
# within its package.
TYPE_ONLY_CIRCLES = (("console.models", "console.tenancy"), ("inference.kinds",))


def layer_of(module: str) -> int:
    for index, (_name, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"{module} {UNLISTED}")


UNLISTED = ("is on no floor: list it in LAYERS in tests/unit/test_layers.py, on the floor "
            "docs/dev/architecture.md shows it on (its views, serializers, URLs, admin and "
            "commands on entry points; its models, services, selectors and tasks below)")


def listing_problems(modules: Collection[str]) -> list[str]:
    """What is wrong with the floors' listing of these modules: one on no floor or on two,
    and a listed name that is no module any more (a listing left behind misleads)."""
    problems = []
    for module in sorted(modules):
        floors = [name for name, patterns in LAYERS
                  if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns)]
        if not floors:
            problems.append(f"{module} {UNLISTED}")
        elif len(floors) > 1:
            problems.append(f"{module} is on {' and '.join(floors)}: list it on one")
    problems += [f"{pattern} is listed on {name} and is no module: unlist it"
                 for name, patterns in LAYERS for pattern in patterns
                 if not any(fnmatch.fnmatchcase(module, pattern) for module in modules)]
    return problems


def project_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for app in PRODUCT_APPS:
        for path in (ROOT / app).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imported(path: Path, module: str, known: dict[str, Path], *,
             types: bool) -> Iterator[str]:
    """The project modules `module` imports, wherever in it the import stands, one per
    name imported (`import a, b` and `from p import a, b` import both); with `types` false,
    less those imported under TYPE_CHECKING only."""
    for node, typing_only in imports_of(path):
        if not types and typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            assert node.level == 0, f"{module}: relative import"
            assert node.module is not None
            # `from p import a` imports the module p.a where there is one, else a name of p.
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


@functools.cache
def imports_of(path: Path) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """A module's import statements, each with whether it stands under TYPE_CHECKING: read
    once for the tests here (they only read them). Walking a tree is most of this file's
    time, so each is walked once; only the TYPE_CHECKING blocks are walked again."""
    nodes = list(ast.walk(parsed(path)))
    typing_only = {id(inner) for node in nodes if type_checking_only(node)
                   for statement in node.body for inner in ast.walk(statement)}
    return [(node, id(node) in typing_only) for node in nodes
            if isinstance(node, ast.Import | ast.ImportFrom)]


def type_checking_only(node: ast.AST) -> TypeGuard[ast.If]:
    """Whether `node` is an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`), whose body
    alone nothing runs: its `else:` runs, as does the body of `if not TYPE_CHECKING:` or of
    any other test that merely mentions it."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        and isinstance(test.value, ast.Name) and test.value.id == "typing")


@functools.cache
def import_graph(*, types: bool = True) -> dict[str, set[str]]:
    known = project_modules()
    return {module: set(imported(path, module, known, types=types))
            for module, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_product_apps_are_every_package_it_ships() -> None:
    """The one list the fitness tests read (tests/product.py) is every app the settings
    install from this repository and every package in it but the tests' and benchmarks'."""
    installed = {entry.split(".")[0] for entry in settings.INSTALLED_APPS
                 if (ROOT / entry.split(".")[0]).is_dir()}
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - set(NOT_PRODUCT)
    assert set(PRODUCT_APPS) == installed == packages


def test_every_module_is_on_one_named_floor() -> None:
    problems = listing_problems(project_modules())
    assert not problems, "\n".join(problems)


def test_no_import_runs_up_a_layer() -> None:
    graph = import_graph()
    upward = sorted(
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
        f"({LAYERS[layer_of(target)][0]})"
        for module, targets in graph.items()
        for target in targets if layer_of(target) > layer_of(module))
    assert upward == []


def test_no_two_modules_import_each_other() -> None:
    assert circles(import_graph(types=False)) == []


def test_the_only_circles_are_type_only_and_within_their_package() -> None:
    # (console.models and console.tenancy; inference.kinds and its kinds)
    assert [circle for circle in circles(import_graph())
            if not any(all(member.startswith(allowed) for member in circle)
                       for allowed in TYPE_ONLY_CIRCLES)] == []


def test_the_apps_below_the_entry_points_form_no_circle() -> None:
    graph = import_graph()
    apps = ("billing", "inference", "jobs", "openai_api", "realtime")
    between = {app: {target.split(".")[0] for module, targets in graph.items()
                     if module.split(".")[0] == app for target in targets} - {app}
               for app in apps}
    package_graph = {app: {target for target in between[app] if target in apps}
                     for app in apps}
    assert circles(package_graph) == []


def test_the_layer_check_catches_an_upward_import() -> None:
    # given a kind importing the jobs app, and two modules importing each other
    graph = {"inference.kinds.chat": {"jobs.models"}, "jobs.models": set(),
             "jobs.a": {"jobs.b"}, "jobs.b": {"jobs.a"}}
    # then the upward import and the circle are both seen
    assert layer_of("jobs.models") > layer_of("inference.kinds.chat")
    assert circles(graph) == [["jobs.a", "jobs.b"]]


# -- the parser, on the cases it once misread ----------------------------------------------

SYNTHETIC = ("app", "app.a", "app.b", "app.c", "app.d", "app.e", "app.f", "app.g", "app.h",
             "app.i")


def _read(tmp_path: Path, source: str, *, types: bool) -> set[str]:
    """What the parser says `app.reader`, written as `source`, imports of SYNTHETIC."""
    path = tmp_path / "reader.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    known = {name: tmp_path / f"{name}.py" for name in SYNTHETIC} | {"app.reader": path}
    return set(imported(path, "app.reader", known, types=types))


def test_the_parser_records_every_name_an_import_names(tmp_path: Path) -> None:
    # given an `import a, b` and a `from pkg import a, b` (of modules, and of names)
    source = """
        import app.a, app.b
        from app import c, d
        from app.e import THING, OTHER
        def later():
            import app.f, app.g
    """
    # then every module named is imported, wherever the statement stands
    assert _read(tmp_path, source, types=False) == {"app.a", "app.b", "app.c", "app.d",
                                                    "app.e", "app.f", "app.g"}


def test_only_the_body_of_if_type_checking_is_type_only(tmp_path: Path) -> None:
    # given imports under a positive TYPE_CHECKING, its else, and a negative one
    source = """
        import typing
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import app.a
        else:
            import app.b
        if not TYPE_CHECKING:
            import app.c
        if typing.TYPE_CHECKING:
            from app import d
        if TYPE_CHECKING or app_is_loaded:
            import app.e
    """
    # then only the positive bodies are left out of what runs
    assert _read(tmp_path, source, types=False) == {"app.b", "app.c", "app.e"}
    assert _read(tmp_path, source, types=True) == {"app.a", "app.b", "app.c", "app.d",
                                                   "app.e"}


def test_a_module_on_no_floor_fails_saying_where_to_list_it() -> None:
    # given a product module that no floor lists (a new app's, or a new one in a listed
    # app), beside the listed ones
    for module in ("newapp.services", "jobs.newly_added", "realtime.newly_added"):
        # then the listing test fails naming it and where to list it, as does its floor
        assert listing_problems({*project_modules(), module}) == [f"{module} {UNLISTED}"]
        with pytest.raises(AssertionError, match=r"list it in LAYERS in tests/unit/test_la"):
            layer_of(module)
