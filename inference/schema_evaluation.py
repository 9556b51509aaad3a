"""The evaluation of one answer against a customer's JSON schema, bounded by the work it does
(docs/dev/decisions/2026-12-01-the-work-a-customers-schema-may-cost.md).

jsonschema evaluates; this module decides what each keyword it evaluates costs. A keyword
evaluated spends a step; one more for each subschema it descends into (an `anyOf` branch
tried, an item or property of the answer gone over, a `$ref` followed: a `false` holds no
keyword, yet makes an error); and one more for every ELEMENTS_PER_STEP elements of the work
it does besides: the entries of its value it goes over (a `required` or `type` list, a
`properties` object), the nodes of the answer it hashes or compares (`enum`, `const`,
`uniqueItems`), the members of the subschema it sits in (walked at each visit), and a
pattern's scans (the characters read times the size of its RE2 program,
CHARACTERS_PER_ELEMENT to an element). An `enum` is a set of hashed values, built once per
answer (its values counted then) and looked up at each visit, where jsonschema compared the
answer with every value in turn. The check at submit (inference.response_format) adds the
same weights of the schema's own values.

An answer stops at MAX_EVALUATION_STEPS or MAX_EVALUATION_SECONDS of its thread's CPU,
whichever comes first (EvaluationBudgetSpent). The steps decide in practice, the same on a
busy machine; the clock is the backstop for work no weight foresaw. For the clock to be
read often, no keyword may run long between two steps: the answer is evaluated as a copy
whose arrays, objects, strings and integers print as a few characters (jsonschema puts the
instance in every error message it makes, and a branch that fails makes one: a `false` in
an `anyOf` printed the whole answer each time it was tried), and the keywords that would
print a schema value or an answer's items make their own short messages."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import re2
from jsonschema import Draft202012Validator, ValidationError, _keywords, validators
from jsonschema import _legacy_keywords as legacy
from jsonschema import _utils as library
from jsonschema._utils import equal
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import lookup_recursive_ref

# The budget of one answer's evaluation, in steps (above). Recursion and arrays multiply
# the submit bound (inference.response_format) by the answer's shape, so this is what holds.
# A step is about 2-7 us of one core here, whatever the schema's shape (measured over
# sixteen, the attacks of tests/db/test_schema_attacks.py among them: 16,000 integers take
# 32,000 steps in 0.09 s, a recursive oneOf spends the budget in 0.45 s, the dearest shape
# 7.1 us a step), so the budget is at most about 0.7 s: 3 minutes for a chunk of 256 rows
# that all spend it, far inside the chunk's 60-minute limit. Past it the answer is
# unsatisfied (the row's format_error). A 32,768-token answer of 16,000 integers takes
# about 32,000.
MAX_EVALUATION_STEPS = 100_000
# And of its thread's CPU (not the wall clock: a thread waiting for the GIL behind other
# chunks spends none of it), whichever ends first: above the steps' 0.7 s, so the steps
# decide (the same on a busy machine), and the clock only stops work no weight foresaw.
MAX_EVALUATION_SECONDS = 1.0
# The elements of work a step pays for besides its keyword: an element is about 0.3 us.
ELEMENTS_PER_STEP = 16
# A string's characters per element (hashing it, comparing it, scanning it with an RE2
# program of one instruction: RE2 without its DFA takes about 5 ns a character and
# instruction, measured on a 128 KiB answer).
CHARACTERS_PER_ELEMENT = 64
# The clock is read every this many steps (a read costs less than a step).
_CLOCK_EVERY = 32
# RE2 compiles a pattern into an automaton of at most this much memory, or refuses it.
_RE2_MAX_MEM = 8 * 1024 * 1024
# A search's own cost in elements besides its scan (a call into RE2: about a microsecond).
_SEARCH_ELEMENTS = 4
# Keywords whose value is a map of entries each one goes over (a name each, a list of names).
_ENTRY_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas",
                         "dependentRequired", "dependencies"})
# Keywords whose value is a list of subschemas: each one descended into is a step of its own
# (a visit of a child at submit), not an element.
_BRANCHES = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
# Branches tried in turn until one decides (each a step as it is tried).
_TRIED = frozenset({"anyOf", "oneOf"})
# Keywords that descend once per item of an answer's array, or per property of its object.
_PER_ITEM = frozenset({"items", "additionalItems", "contains", "unevaluatedItems"})
_PER_PROPERTY = frozenset({"propertyNames", "additionalProperties", "patternProperties",
                           "unevaluatedProperties"})
# Keywords that descend into the subschema of each of their entries the answer has.
_PER_ENTRY = frozenset({"properties", "dependentSchemas", "dependencies"})
# Keywords that descend into a schema they name.
_REFERENCES = frozenset({"$ref", "$dynamicRef", "$recursiveRef", "not", "if"})
# Keywords that hash or compare the answer node they are evaluated on, whole.
_HASHING = frozenset({"enum", "uniqueItems"})


class EvaluationBudgetSpent(ValueError):
    """An answer's evaluation took more than its step budget or its CPU time."""


def evaluate(value: Any, schema: dict[str, Any], *, steps: int,
             seconds: float | None) -> bool:
    """Whether `value` (a parsed answer) satisfies `schema`, within `steps` and `seconds`
    of this thread's CPU (None: no clock). Refs resolve inside the schema only, and every
    regex runs on RE2."""
    base = validators.validator_for(schema, default=Draft202012Validator)
    validator = _safe(base)(schema, registry=NO_RETRIEVAL)
    token = _budget.set(_Budget(steps, seconds))
    try:
        return bool(validator.is_valid(_answer(value)))
    finally:
        _budget.reset(token)


# -- the weights, shared with the check at submit ----------------------------------------

def keywords_of(schema: Any) -> frozenset[str]:
    """The keywords evaluated under this schema's dialect (its $schema, 2020-12 by default)."""
    base = validators.validator_for(schema, default=Draft202012Validator)
    return frozenset(base.VALIDATORS)


def value_elements(keyword: str, value: Any) -> int:
    """The entries of a keyword's value it goes over at every evaluation (a required or
    type list, a properties object, dependentRequired's names); 0 for a value that is one
    subschema (its members count as that subschema's own), a list of them (each a descent:
    a step at run time, a visit at submit) or a number. An enum's values are hashed once
    per answer instead (enum_elements), and const compares as far as the answer goes."""
    if keyword in ("enum", "const"):
        return 0
    if isinstance(value, list):
        return 0 if keyword in _BRANCHES else len(value)
    if isinstance(value, dict) and keyword in _ENTRY_MAPS:
        return len(value) + sum(len(entry) for entry in value.values()
                                if isinstance(entry, list))
    return 0


def descents(keyword: str, value: Any, instance: Any) -> int:
    """How many subschemas evaluating this keyword on `instance` may descend into, at most:
    each is a step, besides the steps of the keywords it holds (a `false` holds none, yet
    makes an error)."""
    if keyword in _BRANCHES and isinstance(value, list):
        if keyword in _TRIED:
            return 0  # each branch tried spends its step as it is tried (_any_of, _one_of)
        if keyword == "allOf":
            return len(value)
        return min(len(value), len(instance)) if isinstance(instance, list) else 0
    if keyword in _PER_ITEM:
        return len(instance) if isinstance(instance, list) else 0
    if keyword in _PER_PROPERTY:
        return len(instance) if isinstance(instance, dict) else 0
    if keyword in _PER_ENTRY and isinstance(value, dict):
        return min(len(value), len(instance)) if isinstance(instance, dict) else 0
    return 1 if keyword in _REFERENCES else 0


def enum_elements(value: Any) -> int:
    """An enum's hashed values, built once per answer: their nodes and characters."""
    return size_of(value)


def size_of(value: Any) -> int:
    """A JSON value's nodes, a string counting one more for every CHARACTERS_PER_ELEMENT
    characters (an object's keys as strings). Without recursion: a value may be deep."""
    known = getattr(value, "size", None)  # an answer's arrays and objects carry their own
    if known is not None:
        return int(known)
    total = 0
    stack = [value]
    while stack:
        node = stack.pop()
        total += 1
        if isinstance(node, str):
            total += len(node) // CHARACTERS_PER_ELEMENT
        elif isinstance(node, dict):
            total += sum(1 + len(str(key)) // CHARACTERS_PER_ELEMENT for key in node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return total


def steps_for(elements: int) -> int:
    return elements // ELEMENTS_PER_STEP


@functools.lru_cache(maxsize=1024)
def regex(pattern: str) -> Any:
    options = re2.Options()
    options.max_mem = _RE2_MAX_MEM
    options.log_errors = False  # a refused pattern is the customer's, not a log line
    return re2.compile(pattern, options)


def _scan_elements(pattern: str, characters: int, searches: int = 1) -> int:
    # RE2's program size bounds the states it steps per character when its DFA gives up.
    return (searches * _SEARCH_ELEMENTS + characters * max(int(regex(pattern).programsize), 1)
            // CHARACTERS_PER_ELEMENT)


# -- the budget ----------------------------------------------------------------------------

class _Budget:
    """One answer's steps and clock, and what it builds once (an enum's set, a value's
    size, which keyword of a subschema is evaluated first). Keyed by the schema's objects,
    which live as long as the evaluation."""

    def __init__(self, steps: int, seconds: float | None) -> None:
        self.steps = steps
        self.left = steps
        self.seconds = seconds
        self.deadline = None if seconds is None else time.thread_time() + seconds
        self.clock_at = steps - _CLOCK_EVERY
        self.enums: dict[int, frozenset[Any]] = {}
        self.sizes: dict[int, int] = {}
        self.first: dict[int, str | None] = {}

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise EvaluationBudgetSpent(
                f"checking the answer took more than {self.steps:,} schema steps")
        if self.left <= self.clock_at:
            self.clock_at = self.left - _CLOCK_EVERY
            if self.deadline is not None and time.thread_time() > self.deadline:
                raise EvaluationBudgetSpent(
                    f"checking the answer took more than {self.seconds:g} s")

    def size(self, value: Any) -> int:
        key = id(value)
        if key not in self.sizes:
            self.sizes[key] = size_of(value)
        return self.sizes[key]

    def enum(self, values: Iterable[Any]) -> frozenset[Any]:
        key = id(values)
        found = self.enums.get(key)
        if found is None:
            self.spend(steps_for(enum_elements(values)))
            found = self.enums[key] = frozenset(_canonical(each) for each in values)
        return found

    def first_keyword(self, schema: dict[str, Any], known: Any) -> str | None:
        key = id(schema)
        if key not in self.first:
            self.first[key] = next((name for name in schema if name in known), None)
        return self.first[key]


_budget: ContextVar[_Budget | None] = ContextVar("schema_budget", default=None)


def _spend(elements: int = 0) -> None:
    budget = _budget.get()
    if budget is not None:
        budget.spend(1 + steps_for(elements))


def _counted(name: str, keyword: Callable[..., Any]) -> Callable[..., Any]:
    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        budget = _budget.get()
        if budget is not None:
            elements = value_elements(name, value)
            if name in _HASHING:
                elements += size_of(instance)
            elif name == "const":
                elements += min(size_of(instance), budget.size(value))
            elif name == "pattern" and isinstance(instance, str) and isinstance(value, str):
                elements += _scan_elements(value, len(instance))
            if isinstance(schema, dict) and budget.first_keyword(
                    schema, validator.VALIDATORS) == name:
                elements += len(schema)  # the subschema's members, walked at each visit
            budget.spend(1 + descents(name, value, instance) + steps_for(elements))
        return keyword(validator, value, instance, schema)
    return counted


# -- the answer, as evaluated --------------------------------------------------------------
#
# jsonschema writes the instance into the message of every error it makes (`f"{instance!r}
# is not of type ..."`, "False schema does not allow ..."), and a branch that fails makes
# errors: printed whole, a 100 KB answer costs each failing branch a millisecond no step
# counted. These print as a few characters; they compare, hash and type-check as the JSON
# value they copy (subclasses of str, int, list and dict).

class _String(str):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"<string of {len(self):,} characters>"


class _Integer(int):
    __slots__ = ()

    def __repr__(self) -> str:
        return "<integer>"


class _Array(list[Any]):
    __slots__ = ("size",)
    size: int

    def __repr__(self) -> str:
        return f"<array of {len(self):,} items>"


class _Object(dict[Any, Any]):
    __slots__ = ("key_characters", "size")
    key_characters: int
    size: int

    def __repr__(self) -> str:
        return f"<object of {len(self):,} properties>"


def _answer(value: Any) -> Any:
    """The answer as evaluated (above), each array and object knowing its size (size_of)
    and an object its keys' characters. Without recursion: an answer may be deep."""
    made: list[tuple[Any, Any]] = []  # (copy, original), parents before their children

    def copy(node: Any) -> Any:
        if isinstance(node, str):
            return _String(node)
        if isinstance(node, int) and not isinstance(node, bool):
            return _Integer(node)
        if isinstance(node, dict):
            made.append((_Object(), node))
            return made[-1][0]
        if isinstance(node, list):
            made.append((_Array(), node))
            return made[-1][0]
        return node

    root = copy(value)
    index = 0
    while index < len(made):
        target, source = made[index]
        index += 1
        if isinstance(target, _Object):
            for key, item in source.items():
                target[_String(key)] = copy(item)
        else:
            target.extend(copy(item) for item in source)
    for target, _ in reversed(made):  # children first: each was made after its parent
        if isinstance(target, _Object):
            target.key_characters = sum(len(key) for key in target)
            target.size = 1 + sum(1 + len(key) // CHARACTERS_PER_ELEMENT + size_of(item)
                                  for key, item in target.items())
        else:
            target.size = 1 + sum(size_of(item) for item in target)
    return root


def _key_characters(instance: Any) -> int:
    return int(getattr(instance, "key_characters", 0)) or sum(len(str(k)) for k in instance)


# -- the keywords replaced -----------------------------------------------------------------

def _never_retrieve(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class


# jsonschema's default registry retrieves any other URI with urlopen: this one never does.
NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_never_retrieve)  # type: ignore[call-arg]


def _search(pattern: str, text: str) -> bool:
    return regex(pattern).search(text) is not None


def _spend_scans(patterns: Iterable[str], instance: Any) -> None:
    """Each pattern matched against every key of `instance`, paid before it runs."""
    patterns = list(patterns)
    if not patterns:
        return
    characters = _key_characters(instance)
    _spend(sum(_scan_elements(pattern, characters, len(instance)) for pattern in patterns))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError("does not match the pattern")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    _spend_scans(patterns, instance)
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
    _spend_scans(patterns, instance)
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
            yield ValidationError("an unevaluated property is not allowed")
            return


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any) -> list[str]:
    """jsonschema's find_evaluated_property_keys_by_schema (2020-12 rules, and 2019-09's
    $recursiveRef), with patternProperties matched by RE2: the library's own uses `re`."""
    if validator.is_type(schema, "boolean"):
        return []
    _spend(len(instance) + len(schema))
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
    patterns = schema.get("patternProperties", {})
    _spend_scans(patterns, instance)
    for pattern in patterns:
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


def _unevaluated_items(finder: Callable[..., list[int]]) -> Callable[..., Iterator[Any]]:
    """The draft's unevaluatedItems, its evaluated indexes looked up in a set: the library
    looks each index up in a list, quadratic in a long array."""
    def unevaluated_items(validator: Any, unevaluated: Any, instance: Any,
                          schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "array"):
            return
        evaluated = set(finder(validator, instance, schema))
        if any(index not in evaluated for index in range(len(instance))):
            yield ValidationError("an unevaluated item is not allowed")
    return unevaluated_items


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # The library compares unhashable items pairwise: quadratic in a long generated array.
    if unique and validator.is_type(instance, "array"):
        seen = [_canonical(item) for item in instance]
        if len(set(seen)) != len(seen):
            yield ValidationError("has non-unique elements")


def _enum(validator: Any, values: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # One hashed lookup: the library compares the answer with each value in turn (and
    # prints them all when none matches).
    budget = _budget.get()
    found = _canonical(instance) in budget.enum(values) if budget is not None \
        else any(equal(each, instance) for each in values)
    if not found:
        yield ValidationError("is not one of the enum's values")


def _const(validator: Any, const: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not equal(instance, const):
        yield ValidationError("is not the const value")


def _required(validator: Any, required: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # One error, not one per name missing.
    if validator.is_type(instance, "object") and any(name not in instance
                                                     for name in required):
        yield ValidationError("a required property is missing")


def _dependent_required(validator: Any, dependent: Any, instance: Any,
                        schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "object") and any(
            name in instance and any(each not in instance for each in needed)
            for name, needed in dependent.items()):
        yield ValidationError("a property a present property depends on is missing")


def _any_of(validator: Any, branches: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # A failing branch is left at its first error (the library collects them all).
    for index, branch in enumerate(branches):
        _spend()
        if next(validator.descend(instance, branch, schema_path=index), None) is None:
            return
    yield ValidationError("is not valid under any of the given schemas")


def _one_of(validator: Any, branches: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # Stops at the second valid branch (the library tries every one, then prints them).
    valid = 0
    for index, branch in enumerate(branches):
        _spend()
        if next(validator.descend(instance, branch, schema_path=index), None) is None:
            valid += 1
            if valid > 1:
                yield ValidationError("is valid under more than one of the given schemas")
                return
    if not valid:
        yield ValidationError("is not valid under any of the given schemas")


def _not(validator: Any, negated: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.evolve(schema=negated).is_valid(instance):
        yield ValidationError("is valid under the schema it must not be")


def _canonical(value: Any) -> Any:
    """A hashable form under JSON equality, as jsonschema's `equal` decides it: 1 == 1.0,
    true is not 1, key order is free."""
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


_SAFE_KEYWORDS: dict[str, Callable[..., Any]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
    "uniqueItems": _unique_items,
    "enum": _enum,
    "const": _const,
    "required": _required,
    "dependentRequired": _dependent_required,
    "anyOf": _any_of,
    "oneOf": _one_of,
    "not": _not,
}
# Each draft's unevaluatedItems by the finder of evaluated indexes it uses.
_UNEVALUATED_ITEMS = {
    _keywords.unevaluatedItems: library.find_evaluated_item_indexes_by_schema,
    legacy.unevaluatedItems_draft2019: legacy.find_evaluated_item_indexes_by_schema,
}


@functools.cache
def _safe(base: Any) -> Any:
    """The draft's validator with the keywords above in place of its own (only those the
    draft has: unevaluatedProperties means nothing before 2019-09), each keyword spending
    its steps."""
    keywords = dict(base.VALIDATORS)
    for name, function in _SAFE_KEYWORDS.items():
        if name in keywords:
            keywords[name] = function
    finder = _UNEVALUATED_ITEMS.get(keywords.get("unevaluatedItems"))  # type: ignore[arg-type]
    if finder is not None:
        keywords["unevaluatedItems"] = _unevaluated_items(finder)
    return validators.extend(base, {name: _counted(name, function)
                                    for name, function in keywords.items()})
