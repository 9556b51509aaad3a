"""The layering of docs/dev/architecture.md, held to the code: every import (at the top of a
module, inside a function, or for types only) runs down the layers, never up, and no two
modules import each other at run time, however indirectly (a type-only import back, under
TYPE_CHECKING, is no circle: nothing runs it). Read from the source, no module imported."""

from __future__ import annotations

import ast
import fnmatch
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
assert (ROOT / "manage.py").is_file(), "ROOT is the repository: the layers are read from it"
APPS = ("anex", "billing", "console", "inference", "jobs", "openai_api", "realtime")

# Lowest first; a module is in the first layer one of whose patterns it matches.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("anex", "anex.api", "anex.env", "anex.settings", "anex.net", "anex.crypto",
                "anex.db", "anex.redis", "anex.requestid", "anex.logcontext", "anex.broker",
                "anex.regions", "anex.errors", "anex.api.errors", "anex.logsafe")),
    ("model facts", ("inference", "inference.apps", "inference.catalog", "inference.constants",
                     "inference.pricing", "inference.response_format",
                     "inference.schema_evaluation", "inference.tokens",
                     "inference.chat_template", "inference.token_pieces",
                     "inference.warmth")),
    ("row rules and engines", ("inference.rows", "inference.rows.*", "inference.engines",
                               "inference.engines.*", "inference.corpus",
                               "inference.checkpoints")),
    ("task kinds", ("inference.kinds", "inference.kinds.*")),
    ("tenants and money", ("console", "console.apps", "console.models", "console.constants",
                           "console.tenancy", "console.keys", "console.actors",
                           "console.audit", "console.accounts", "console.selectors",
                           "console.services", "billing", "billing.apps", "billing.models",
                           "billing.constants", "billing.allocation", "billing.selectors",
                           "billing.services", "billing.stripe_gateway", "billing.unsettled")),
    ("work", ("jobs", "jobs.apps", "jobs.models", "jobs.constants", "jobs.storage",
              "jobs.jsonl", "jobs.results", "jobs.dispatch", "jobs.failures",
              "jobs.idempotency", "jobs.selectors", "jobs.services", "jobs.services.*",
              "jobs.validation", "jobs.validation.*", "jobs.tasks")),
    ("entry points", ("*",)),
)
# The project's URL map names every view: the one module allowed to look up at all.
URLS = "anex.urls"


def layer_of(module: str) -> int:
    for index, (_name, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"{module} is in no layer")


def project_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for app in APPS:
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
    """The project modules `module` imports, wherever in it the import stands; with
    `types` false, less those imported under TYPE_CHECKING only."""
    for node, typing_only in imports_of(path):
        if not types and typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            assert node.level == 0, f"{module}: relative import"
            assert node.module is not None
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name
                break


@functools.cache
def imports_of(path: Path) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """A module's import statements, each with whether it stands under TYPE_CHECKING: read
    once for the tests here (they only read them). Walking a tree is most of this file's
    time, so each is walked once; only the TYPE_CHECKING blocks are walked again."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = list(ast.walk(tree))
    typing_only = {id(inner) for node in nodes
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for inner in ast.walk(node)}
    return [(node, id(node) in typing_only) for node in nodes
            if isinstance(node, ast.Import | ast.ImportFrom)]


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


def test_no_import_runs_up_a_layer() -> None:
    graph = import_graph()
    upward = sorted(
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
        f"({LAYERS[layer_of(target)][0]})"
        for module, targets in graph.items() if module != URLS
        for target in targets if layer_of(target) > layer_of(module))
    assert upward == []


def test_no_two_modules_import_each_other() -> None:
    assert circles(import_graph(types=False)) == []


def test_billing_inference_and_jobs_form_no_circle() -> None:
    graph = import_graph()
    apps = ("billing", "inference", "jobs")
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
