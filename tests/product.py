"""The product's source as the fitness tests read it (the layers, one writer per state, the
names work is sent by, what no session may keep): one list of its apps, so that a test that
walks the code cannot skip an app another test reads. tests/unit/test_layers.py holds the
list to the apps the settings install."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
assert (ROOT / "manage.py").is_file(), "ROOT is the repository: the product is read from it"
# Every package of the product: the project package and its Django apps.
PRODUCT_APPS = ("anex", "billing", "console", "inference", "jobs", "openai_api", "realtime")
# The repository's other packages, never imported by the product.
NOT_PRODUCT = ("bench", "tests")


def product_sources() -> list[Path]:
    """Every Python file of the product, its migrations aside, in a stable order."""
    return [path for app in PRODUCT_APPS for path in sorted((ROOT / app).rglob("*.py"))
            if "migrations" not in path.relative_to(ROOT).parts]


def relative(path: Path) -> str:
    """A source's name as a failure names it: jobs/services/inputs.py."""
    return path.relative_to(ROOT).as_posix()


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A source's syntax tree, parsed once for every test that reads it."""
    return ast.parse(path.read_text(encoding="utf-8"))


def product_trees() -> Iterator[tuple[str, ast.Module]]:
    for path in product_sources():
        yield relative(path), parsed(path)


# The calls that write a row's fields: through a manager or queryset (which sets what its
# keywords name) or by constructing a row (Model(...), create, bulk_create).
UPDATES = frozenset({"update", "bulk_update", "update_or_create", "get_or_create"})
CREATES = frozenset({"create", "bulk_create"})


def writers(model: str, fields: Collection[str], *, related: str | None = None,
            trees: Iterable[tuple[str, ast.Module]] | None = None) -> set[str]:
    """The product modules (or the named `trees`) that write one of `fields` of `model`
    (docs/dev/architecture.md: each state has one writer), read from the source:
    - an update through the model's manager, or a `related` manager (`job.chunks`), that
      sets one of them: by keyword, in `defaults`, in bulk_update's field list, or through
      a `**` of a dict made elsewhere (which may hold any field, so it counts);
    - a row made with one of them by keyword (`Model(...)`, `create`, `bulk_create`);
    - an assignment `x.<field> = <Model>Status…` (a row changed in memory, then saved);
    - SQL that updates the model's table and names one of them after SET."""
    found = set()
    sql = re.compile(rf"UPDATE\s+\w*_{model.lower()}\b.*?\bSET\b.*?\b({'|'.join(fields)})\b",
                     re.IGNORECASE | re.DOTALL)
    for name, tree in product_trees() if trees is None else trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _writes(node, model, fields, related):
                found.add(name)
            elif isinstance(node, ast.Assign) and any(
                    isinstance(target, ast.Attribute) and target.attr in fields
                    for target in node.targets) and f"{model}Status" in ast.unparse(node.value):
                found.add(name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and sql.search(node.value):
                found.add(name)
    return found


def _writes(call: ast.Call, model: str, fields: Collection[str], related: str | None) -> bool:
    func = call.func
    if isinstance(func, ast.Name):  # Model(...)
        return func.id == model and _sets(call, fields, splat=False)
    if not isinstance(func, ast.Attribute) or func.attr not in UPDATES | CREATES:
        return False
    if not {model, related} & _receiver_names(func.value):
        return False
    if func.attr == "bulk_update":
        listed = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "fields"), None)
        return not isinstance(listed, ast.List | ast.Tuple | ast.Set) or any(
            isinstance(item, ast.Constant) and item.value in fields for item in listed.elts)
    if func.attr == "bulk_create":
        return False  # its rows are made by Model(...), read above
    return _sets(call, fields, splat=func.attr in UPDATES)


def _sets(call: ast.Call, fields: Collection[str], *, splat: bool) -> bool:
    for keyword in call.keywords:
        if keyword.arg in fields or (keyword.arg is None and splat):
            return True
        if keyword.arg in ("defaults", "create_defaults"):
            value = keyword.value
            if not isinstance(value, ast.Dict) or any(
                    key is None or (isinstance(key, ast.Constant) and key.value in fields)
                    for key in value.keys):
                return True
    return False


def _receiver_names(node: ast.expr) -> set[str]:
    """The names along a call's receiver: `Input.objects.filter(pk=1)` -> Input, objects,
    filter; `job.chunks.select_for_update()` -> job, chunks, select_for_update."""
    names = set()
    while isinstance(node, ast.Attribute | ast.Call):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        else:
            node = node.func
    if isinstance(node, ast.Name):
        names.add(node.id)
    return names
