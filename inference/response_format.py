"""The check of a response_format, job-level (400 at submit) or per row, and the one place a
customer's JSON schema is evaluated.

output-format.txt: two shapes are accepted, {"type": "json_object"} and {"type":
"json_schema", "json_schema": {"schema": {...}}}. The check is structural: the schema's
own contents are not validated against the JSON Schema spec, so a well-formed but
unsatisfiable schema still reaches the model (and its rows may end as format errors).

A schema is also customer code that the worker runs (docs/decisions.md, "Customer JSON
schemas"), so besides its shape the check refuses what would let it reach outside the
schema or run without bound: a size and a nesting cap, a `$ref` that does not start with
`#` (another document: a URL or a file), and a pattern RE2 cannot compile. The evaluator
below never retrieves a document and matches every pattern with RE2, in linear time.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import re2
from jsonschema import Draft202012Validator, ValidationError, validators
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import lookup_recursive_ref

TYPES = ("json_schema", "json_object")
# The whole response_format, compact JSON, in UTF-8 bytes. A real schema is a few KB;
# this bounds what every row's check (and the engine's grammar compile) may be handed.
MAX_BYTES = 64 * 1024
# Objects and arrays inside one another, the response_format itself being level 1. A schema
# ten objects deep is about 25; the evaluator recurses per level, so this keeps it far from
# Python's recursion limit.
MAX_DEPTH = 64
# The keywords that point at another schema. Only "#..." (inside this document) is taken.
REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# RE2 compiles a pattern into an automaton of at most this much memory, or refuses it.
_RE2_MAX_MEM = 8 * 1024 * 1024
_QUOTE_CHARS = 100


def response_format_problem(value: Any) -> str | None:
    """What is wrong with this response_format, or None when it may be used."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return "response_format must be an object with a type."
    too_big = _size_problem(value)
    if too_big:
        return too_big
    kind = value["type"]
    if kind not in TYPES:
        return (f"response_format.type must be json_schema or json_object, not "
                f"{kind[:_QUOTE_CHARS]!r}.")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            return ("response_format of type json_schema needs an object at "
                    "response_format.json_schema.schema.")
        return _schema_problem(spec["schema"])
    return None


def _size_problem(value: Any) -> str | None:
    # Depth first, without recursion: json.dumps below recurses once per level.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return (f"response_format nests objects and arrays more than {MAX_DEPTH} levels "
                    "deep; flatten the schema.")
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          default=str).encode())
    if size > MAX_BYTES:
        return (f"response_format is {size:,} bytes as JSON, over the {MAX_BYTES:,}-byte "
                "limit; shorten the schema.")
    return None


def _schema_problem(schema: dict[str, Any]) -> str | None:
    for where, key, child in _keywords(schema, "response_format.json_schema.schema"):
        if key in REFERENCE_KEYWORDS and isinstance(child, str) and not child.startswith("#"):
            return (f"{where} is {child[:_QUOTE_CHARS]!r}: a reference must point inside the "
                    "schema (start with '#'); other documents and URLs are never fetched. "
                    "Put the referenced schema under $defs and refer to it as '#/$defs/...'.")
        if key == "pattern" and isinstance(child, str):
            problem = _pattern_problem(child, where)
            if problem:
                return problem
        if key == "patternProperties" and isinstance(child, dict):
            for pattern in child:
                problem = _pattern_problem(str(pattern), f"{where} key")
                if problem:
                    return problem
    return None


def _keywords(schema: dict[str, Any], root: str) -> Iterator[tuple[str, str, Any]]:
    """Every (path, key, value) of every object in the schema, in document order."""
    stack: list[tuple[str, Any]] = [(root, schema)]
    while stack:
        path, node = stack.pop()
        children: list[tuple[str, Any]] = []
        if isinstance(node, dict):
            for key, child in node.items():
                where = f"{path}.{str(key)[:_QUOTE_CHARS]}"
                yield where, key, child
                children.append((where, child))
        elif isinstance(node, list):
            children = [(f"{path}[{index}]", child) for index, child in enumerate(node)]
        stack.extend(reversed(children))


def _pattern_problem(pattern: str, where: str) -> str | None:
    try:
        _regex(pattern)
    except re2.error as error:
        reason = error.args[0].decode(errors="replace") if error.args and isinstance(
            error.args[0], bytes) else str(error)
        return (f"{where} {pattern[:_QUOTE_CHARS]!r} cannot be used: patterns are matched "
                f"with RE2 syntax, which has no lookaround or backreferences ({reason}).")
    return None


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> Any:
    options = re2.Options()
    options.max_mem = _RE2_MAX_MEM
    options.log_errors = False  # a refused pattern is the customer's, not a log line
    return re2.compile(pattern, options)


# -- evaluation -------------------------------------------------------------------------------

def json_schema_satisfied(value: Any, schema: dict[str, Any]) -> bool:
    """Whether a parsed answer satisfies the row's schema.

    Refs resolve inside the schema only (the registry never retrieves: jsonschema's default
    one fetches any other URI with urlopen), and every regex runs on RE2. A schema the
    check above refuses, or anything the evaluation raises, is the caller's to treat as
    unsatisfied."""
    problem = _schema_problem(schema)
    if problem:
        raise ValueError(problem)
    base = validators.validator_for(schema, default=Draft202012Validator)
    validator = _safe(base)(schema, registry=_NO_RETRIEVAL)
    return bool(validator.is_valid(value))


def _never_retrieve(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class


_NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_never_retrieve)  # type: ignore[call-arg]  # attrs


def _search(pattern: str, text: str) -> bool:
    return _regex(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, item in instance.items():
            if _search(pattern, key):
                yield from validator.descend(item, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance if key not in properties
              and not any(_search(pattern, key) for pattern in patterns)]
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif not additional and extras:
        yield ValidationError(f"additional properties are not allowed ({len(extras)} found)")


def _unevaluated_properties(validator: Any, unevaluated: Any, instance: Any,
                            schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = set(_evaluated_keys(validator, instance, schema))
    for key in instance:
        if key not in evaluated and next(
                validator.descend(instance[key], unevaluated, path=key), None) is not None:
            yield ValidationError(f"unevaluated property {key!r} is not allowed")
            return


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any) -> list[str]:
    """jsonschema's find_evaluated_property_keys_by_schema (2020-12 rules, and 2019-09's
    $recursiveRef), with patternProperties matched by RE2: the library's own uses `re`."""
    if validator.is_type(schema, "boolean"):
        return []
    keys: list[str] = []
    resolved_schemas = []
    for keyword in ("$ref", "$dynamicRef"):
        ref = schema.get(keyword)
        if ref is not None:
            resolved_schemas.append(validator._resolver.lookup(ref))
    if "$recursiveRef" in schema:
        resolved_schemas.append(lookup_recursive_ref(validator._resolver))
    for resolved in resolved_schemas:
        keys += _evaluated_keys(
            validator.evolve(schema=resolved.contents, _resolver=resolved.resolver),
            instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys += properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        subschema = schema.get(keyword)
        if subschema is not None:
            keys += [key for key, item in instance.items()
                     if next(validator.descend(item, subschema), None) is None]
    for pattern in schema.get("patternProperties", {}):
        keys += [key for key in instance if _search(pattern, key)]
    for key, subschema in schema.get("dependentSchemas", {}).items():
        if key in instance:
            keys += _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if next(validator.descend(instance, subschema), None) is None:
                keys += _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys += _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys += _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys += _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # The library compares unhashable items pairwise: quadratic in a long generated array.
    if unique and validator.is_type(instance, "array"):
        seen = [_canonical(item) for item in instance]
        if len(set(seen)) != len(seen):
            yield ValidationError("has non-unique elements")


def _canonical(value: Any) -> Any:
    """A hashable form under JSON equality: 1 == 1.0, true is not 1, key order is free."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float) and value.is_integer():
        return ("number", int(value))
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, dict):
        return ("object", frozenset((key, _canonical(item)) for key, item in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    return ("other", value)


_SAFE_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
    "uniqueItems": _unique_items,
}


@functools.cache
def _safe(base: Any) -> Any:
    """The draft's validator with every regex keyword on RE2 (only the keywords the draft
    has: unevaluatedProperties means nothing before 2019-09)."""
    overrides = {keyword: function for keyword, function in _SAFE_KEYWORDS.items()
                 if keyword in base.VALIDATORS}
    return validators.extend(base, overrides)
