"""Issue 42 item 4: the OpenAI surface on the shared rules - one rule, one place, the OpenAI
layer calling it. Held to the source (read, never imported): no module reaches into
another's private names (the OpenAI upload ran on the local S3 stand-in's _StreamedForm);
the OpenAI surface reads no line with the standard library's json (which takes NaN where
the product's readers refuse it); Job.cancel_requested has one writer; and the job
machinery never asks which surface a job came from (Job.openai branched the state machine
and the estimate: the job's stored policy does)."""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from jobs.jsonl import line_dumps
from jobs.results import envelope, result_line_failed

ROOT = Path(__file__).resolve().parents[2]
APPS = ("anex", "billing", "console", "inference", "jobs", "openai_api", "realtime")
# The job machinery and what it stands on: the layers under the surfaces.
CORE = ("anex", "billing", "console", "inference", "jobs")


@functools.cache
def modules() -> dict[str, ast.Module]:
    """Every product module's tree, by its path from the repository (migrations aside:
    they are history, and the data migration names the old flag)."""
    found = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                found[str(path.relative_to(ROOT))] = ast.parse(path.read_text("utf-8"))
    return found


def enclosing(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """Every node with the name of the function it stands in ("" at module level)."""
    def walk(node: ast.AST, name: str) -> Iterator[tuple[ast.AST, str]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else name
            yield child, inner
            yield from walk(child, inner)

    return walk(tree, "")


def test_no_module_imports_another_modules_private_names() -> None:
    private = [(path, node.module, alias.name)
               for path, tree in modules().items() for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module
               and node.module.split(".")[0] in APPS
               for alias in node.names
               if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == []


def test_the_openai_surface_reads_no_line_with_the_standard_librarys_json() -> None:
    loads = [(path, node.lineno) for path, tree in modules().items()
             if path.startswith("openai_api/") for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr == "loads"
             and isinstance(node.value, ast.Name) and node.value.id == "json"]
    assert loads == []


def writes_of(field: str) -> set[tuple[str, str]]:
    """Where `field` of a model is written: as a keyword of an update or a create, an
    attribute assigned, or a key of a dict of values assigned (values["field"] = ...)."""
    writers = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}
    found = set()
    for path, tree in modules().items():
        for node, function in enclosing(tree):
            keyword = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in writers \
                and any(word.arg == field for word in node.keywords)
            attribute = isinstance(node, ast.Attribute) and node.attr == field \
                and isinstance(node.ctx, ast.Store)
            key = isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.slice, ast.Constant) and node.slice.value == field
            if keyword or attribute or key:
                found.add((path, function))
    return found


def test_cancel_requested_has_one_writer_in_the_lifecycle_service() -> None:
    assert writes_of("cancel_requested") == {("jobs/services/lifecycle.py", "_cancel_request")}


def names_openai(node: ast.AST) -> bool:
    """A read of `.openai`, an `openai=` keyword, or a name `openai` assigned (a field)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "openai"
    if isinstance(node, ast.keyword):
        return node.arg == "openai"
    if isinstance(node, ast.Assign):
        return any(isinstance(target, ast.Name) and target.id == "openai"
                   for target in node.targets)
    return False


def test_the_job_machinery_never_asks_which_surface_a_job_came_from() -> None:
    core = tuple(f"{app}/" for app in CORE)
    asked = [(path, getattr(node, "lineno", None)) for path, tree in modules().items()
             if path.startswith(core) for node in ast.walk(tree) if names_openai(node)]
    assert asked == []


# -- a result line's part: the writer's split, read by the product's reader -------------------

ROWS = {
    "answered": {"id": "a", "outcome": "success", "status_code": 200,
                 "body": {"data": [{"embedding": [0.5]}]}, "error": None, "cost": "0.1"},
    "refused": {"id": "b", "outcome": "error", "status_code": 400, "body": None,
                "error": {"message": "failed", "type": "invalid_request_error"},
                "cost": "0"},
    "cut short": {"id": "c", "outcome": "truncated", "status_code": 200, "body": {},
                  "error": None},
}


@pytest.mark.parametrize("name", ROWS)
def test_a_result_lines_part_is_the_one_its_writer_counted_it_in(name: str) -> None:
    row = ROWS[name]
    line = line_dumps(envelope(row))
    assert result_line_failed(line) is (row["error"] is not None)
    # as the envelope's error member is written, whatever the members around it
    assert orjson.loads(line)["error"] == row["error"]


def test_a_result_line_holding_nan_is_refused_as_the_product_reads_lines() -> None:
    line = b'{"id":"batch_req_a","custom_id":"a","response":{"status_code":200,' \
           b'"request_id":"req_a","body":{"x":NaN}},"error":null}\n'
    assert json.loads(line)["error"] is None  # what the surface's own json.loads took
    with pytest.raises(ValueError):
        result_line_failed(line)
