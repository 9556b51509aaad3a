"""The check of a response_format, job-level (400 at submit) or per row, and the one place a
customer's JSON schema is evaluated (json_schema_satisfied; the evaluator itself is
inference.schema_evaluation).

output-format.txt: two shapes are accepted, {"type": "json_object"} and {"type":
"json_schema", "json_schema": {"schema": {...}}}. The check is structural: the schema's
own contents are not validated against the JSON Schema spec, so a well-formed but
unsatisfiable schema still reaches the model (and its rows may end as format errors).

A schema is also customer code that the worker runs
(docs/dev/decisions/2026-12-01-customer-json-schemas.md), so besides its shape the check refuses
what would let it reach outside the schema or run without bound: a size and a nesting cap, a `$ref`
that does not start with `#` (another document: a URL or a file), a pattern RE2 cannot compile, and
a schema whose evaluation would cost more than a bound (CWE-407: a few KB of `oneOf` over `$ref`s
can visit 2**41 subschemas; one `required` list of 9,000 names, referred to 400 times, makes each
visit go over 9,000 names). The evaluator never retrieves a document, matches every pattern with
RE2, in linear time, and stops at a step budget and a CPU time per answer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import re2
from referencing.jsonschema import DRAFT202012, lookup_recursive_ref, specification_with

from inference.schema_evaluation import (
    ELEMENTS_PER_STEP,
    MAX_EVALUATION_SECONDS,
    MAX_EVALUATION_STEPS,
    NO_RETRIEVAL,
    EvaluationBudgetSpent,
    enum_elements,
    evaluate,
    keywords_of,
    regex,
    steps_for,
    value_elements,
)

__all__ = ["MAX_EVALUATION_COST", "MAX_EVALUATION_SECONDS", "MAX_EVALUATION_STEPS",
           "EvaluationBudgetSpent", "json_schema_satisfied", "response_format_problem"]

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
_QUOTE_CHARS = 100
# The evaluation cost bound at submit: the steps one evaluation takes when every keyword
# applies once (each property present, one array item), a `$ref` counted as the schema it
# points to, and a reference back into a schema being counted (recursion) counted once. Each
# subschema visited is a step (an `anyOf` branch is a visit of its own), and one more for
# every ELEMENTS_PER_STEP (16) elements of the work its keywords do whatever the answer
# (inference.schema_evaluation: a `required` or `type` list's names, a `properties`
# object's entries, the subschema's own members), and each enum's values count once,
# hashed once per answer. A structured-output
# schema costs tens to a few thousand (OpenAI's own bound is 5,000 object properties); each
# `$ref` or branch reused in several places multiplies its target's cost. About 0.05 s of
# one core at the evaluator's rate.
MAX_EVALUATION_COST = 10_000
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
        return (f"response_format.json_schema.schema would take more than "
                f"{MAX_EVALUATION_COST:,} steps to check one answer: its oneOf, anyOf, "
                "allOf and $ref branches multiply, and a long required or type list or "
                f"properties object counts a step for every {ELEMENTS_PER_STEP} entries each "
                "time it is visited. Refer to each shared definition from fewer places.")
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
    keywords = keywords_of(schema)
    resolver = NO_RETRIEVAL.resolver_with_root(specification.create_resource(schema))
    saturated = MAX_EVALUATION_COST + 1
    # Each enum's values are hashed once per answer, however often it is visited.
    enums = 0
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
            if isinstance(node, dict) and "enum" in node and "enum" in keywords:
                enums += steps_for(enum_elements(node["enum"]))
            pairs = _subschemas(node, here, specification)
            children[key] = [child for child, _ in pairs]
            # a child already open is a reference back (recursion): counted once, below
            stack.extend(pair for pair in pairs if id(pair[0]) not in open_)
        else:
            stack.pop()
            cost[key] = min(saturated, _node_cost(node, keywords) + sum(
                cost.get(id(child), 1) for child in children.pop(key)))
            if cost[key] + enums >= saturated:
                return saturated
    return cost[id(schema)] + enums


def _node_cost(node: Any, keywords: frozenset[str]) -> int:
    """One visit of a subschema, its children apart: a step, and one more for every
    ELEMENTS_PER_STEP elements its members and its keywords' values make it go over
    (inference.schema_evaluation.value_elements), as the evaluator charges them."""
    if not isinstance(node, dict):
        return 1
    elements = len(node) + sum(value_elements(key, value) for key, value in node.items()
                               if key in keywords)
    return 1 + steps_for(elements)


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
        regex(pattern)
    except re2.error as error:
        reason = error.args[0].decode(errors="replace") if error.args and isinstance(
            error.args[0], bytes) else str(error)
        return (f"{where} {pattern[:_QUOTE_CHARS]!r} cannot be used: patterns are matched "
                f"with RE2 syntax, which has no lookaround or backreferences ({reason}).")
    return None




# -- evaluation -------------------------------------------------------------------------------

def json_schema_satisfied(value: Any, schema: dict[str, Any], *,
                          steps: int = MAX_EVALUATION_STEPS,
                          seconds: float | None = MAX_EVALUATION_SECONDS) -> bool:
    """Whether a parsed answer satisfies the row's schema.

    Refs resolve inside the schema only (the registry never retrieves: jsonschema's default
    one fetches any other URI with urlopen), every regex runs on RE2, and each keyword
    evaluated spends its steps (inference.schema_evaluation): past `steps`, or past
    `seconds` of this thread's CPU (None: no clock), EvaluationBudgetSpent. A schema the
    check above refuses, or anything the evaluation raises, is the caller's to treat as
    unsatisfied."""
    problem = _schema_problem(schema)
    if problem:
        raise ValueError(problem)
    return evaluate(value, schema, steps=steps, seconds=seconds)
