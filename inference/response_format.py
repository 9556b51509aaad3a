"""The check of a response_format, job-level (400 at submit) or per row, and the one place a
customer's JSON schema is evaluated.

output-format.txt: two shapes are accepted, {"type": "json_object"} and {"type":
"json_schema", "json_schema": {"schema": {...}}}. The check is structural: the schema's
own contents are not validated against the JSON Schema spec, so a well-formed but
unsatisfiable schema still reaches the model (and its rows may end as format errors).

A schema is also customer code that the worker runs (docs/decisions.md, "Customer JSON
schemas"), so besides its shape the check refuses what would let it reach outside the
schema or run without bound: a size and a nesting cap, a `$ref` that does not start with
`#` (another document: a URL or a file), a pattern RE2 cannot compile, and a schema whose
branches and references fan out past an evaluation cost bound (CWE-407: a few KB of `oneOf`
over `$ref`s can visit 2**41 subschemas). The evaluator below never retrieves a document,
matches every pattern with RE2, in linear time, and stops at a step budget per answer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import re2
from jsonschema import Draft202012Validator, ValidationError, validators
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import DRAFT202012, lookup_recursive_ref, specification_with

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
# The evaluation cost bound at submit: the subschemas one evaluation visits when every
# keyword applies once (each property present, one array item), a `$ref` counted as the
# schema it points to, and a reference back into a schema being counted (recursion) counted
# once. A structured-output schema has tens to a few thousand (OpenAI's own bound is 5,000
# object properties); each `$ref` or branch reused in several places multiplies its target's
# count. About 0.1 s of one core at the rate below.
MAX_EVALUATION_COST = 10_000
# The budget of one answer's evaluation, in keyword evaluations (a `type`, a `properties`, a
# `$ref` each count one). Recursion and arrays multiply the bound above by the answer's shape,
# so this is what holds. jsonschema takes about 12 us a step: 1.2 s of one core per answer,
# 5 minutes for a chunk of 256 rows that all spend it, far inside the chunk's 60-minute
# limit. A 32,768-token answer of 16,000 integers takes about 32,000. Past it the answer is
# unsatisfied (the row's format_error).
MAX_EVALUATION_STEPS = 100_000
# Keywords whose value is one subschema, a list of them, or an object of them.
_ONE_SCHEMA = ("not", "if", "then", "else", "contains", "additionalItems", "additionalProperties",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties", "items")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_OBJECTS = ("properties", "patternProperties", "dependentSchemas", "dependencies")


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
    if _evaluation_cost(json.dumps(schema, ensure_ascii=False, separators=(",", ":"),
                                   default=str)) > MAX_EVALUATION_COST:
        return (f"response_format.json_schema.schema would visit more than "
                f"{MAX_EVALUATION_COST:,} subschemas to check one answer: its oneOf, anyOf, "
                "allOf and $ref branches multiply. Refer to each shared definition from fewer "
                "places.")
    return None


@functools.lru_cache(maxsize=256)
def _evaluation_cost(text: str) -> int:
    """The bound above for one schema (its compact JSON: every row of a file may carry the
    same one), saturating just past MAX_EVALUATION_COST. Memoized per subschema over the
    reference graph, without recursion: a chain of thousands of `$ref`s is a legal schema."""
    schema = json.loads(text)
    dialect = schema.get("$schema") if isinstance(schema, dict) else None
    specification = specification_with(dialect if isinstance(dialect, str) else "",
                                       default=DRAFT202012)
    resolver = _NO_RETRIEVAL.resolver_with_root(specification.create_resource(schema))
    saturated = MAX_EVALUATION_COST + 1
    cost: dict[int, int] = {}
    children: dict[int, list[Any]] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, Any]] = [(schema, resolver)]
    while stack:
        node, here = stack[-1]
        key = id(node)
        if key in cost:
            stack.pop()
        elif key not in open_:
            open_.add(key)
            pairs = _subschemas(node, here, specification)
            children[key] = [child for child, _ in pairs]
            # a child already open is a reference back (recursion): counted once, below
            stack.extend(pair for pair in pairs if id(pair[0]) not in open_)
        else:
            stack.pop()
            cost[key] = min(saturated, 1 + sum(cost.get(id(child), 1)
                                               for child in children.pop(key)))
            if cost[key] >= saturated:
                return saturated
    return cost[id(schema)]


def _subschemas(node: Any, resolver: Any, specification: Any) -> list[tuple[Any, Any]]:
    """The subschemas evaluating `node` may visit at once: its applicators' and what its
    references resolve to (one that does not resolve visits nothing; it fails the answer)."""
    if not isinstance(node, dict):
        return []
    resolver = resolver.in_subresource(specification.create_resource(node))
    found: list[Any] = []
    for keyword in _ONE_SCHEMA:
        if isinstance(node.get(keyword), dict | bool):
            found.append(node[keyword])
    for keyword in _SCHEMA_LISTS:
        if isinstance(node.get(keyword), list):
            found.extend(node[keyword])
    for keyword in _SCHEMA_OBJECTS:
        if isinstance(node.get(keyword), dict):
            found.extend(node[keyword].values())
    pairs = [(child, resolver) for child in found if isinstance(child, dict | bool)]
    for keyword in REFERENCE_KEYWORDS:
        ref = node.get(keyword)
        if not isinstance(ref, str):
            continue
        resolved = _resolved(resolver, keyword, ref)
        if resolved is not None:
            pairs.append((resolved.contents, resolved.resolver))
    return pairs


def _resolved(resolver: Any, keyword: str, ref: str) -> Any:
    try:
        return (lookup_recursive_ref(resolver) if keyword == "$recursiveRef"
                else resolver.lookup(ref))
    except Exception:  # unresolvable: the evaluation raises, the answer fails
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

def json_schema_satisfied(value: Any, schema: dict[str, Any], *,
                          steps: int = MAX_EVALUATION_STEPS) -> bool:
    """Whether a parsed answer satisfies the row's schema.

    Refs resolve inside the schema only (the registry never retrieves: jsonschema's default
    one fetches any other URI with urlopen), every regex runs on RE2, and every keyword
    evaluated spends one of `steps` (EvaluationBudgetSpent past them). A schema the check
    above refuses, or anything the evaluation raises, is the caller's to treat as
    unsatisfied."""
    problem = _schema_problem(schema)
    if problem:
        raise ValueError(problem)
    base = validators.validator_for(schema, default=Draft202012Validator)
    validator = _safe(base)(schema, registry=_NO_RETRIEVAL)
    token = _steps_left.set([steps])
    try:
        return bool(validator.is_valid(value))
    finally:
        _steps_left.reset(token)


class EvaluationBudgetSpent(ValueError):
    """An answer's evaluation took more than its step budget."""


# The steps the evaluation running in this thread may still take (one mutable cell).
_steps_left: ContextVar[list[int] | None] = ContextVar("schema_steps_left", default=None)


def _step() -> None:
    left = _steps_left.get()
    if left is None:
        return
    left[0] -= 1
    if left[0] < 0:
        raise EvaluationBudgetSpent(
            f"checking the answer took more than {MAX_EVALUATION_STEPS:,} schema steps")


def _counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _step()
        return keyword(validator, value, instance, schema)
    return counted


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
    _step()
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
    has: unevaluatedProperties means nothing before 2019-09), each keyword counting a step."""
    keywords = {**base.VALIDATORS, **{keyword: function for keyword, function
                                      in _SAFE_KEYWORDS.items() if keyword in base.VALIDATORS}}
    return validators.extend(base, {keyword: _counted(function)
                                    for keyword, function in keywords.items()})
