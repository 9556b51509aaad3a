"""Issue 11, item 1: a customer's JSON schema is code the worker runs. Each attack from the
review is performed here - a `$ref` to a server (SSRF, a tarpit), to `file:///dev/zero`
(OOM), a catastrophic regex in a `not` branch (a frozen process) - at submit, in the row
checks, and in the engine's own check, and each fails safely: nothing is fetched, the time
is bounded, and the row (never the chunk) carries the failure."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from billing.services import credits_summary
from console.models import Organization
from inference import response_format as rf
from inference.engines import ChatEngine, ChatRow, ChatSettings
from inference.engines.chat import _satisfies
from inference.schema_evaluation import evaluate
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.estimation import job_estimate
from tests.factories import input_ready
from tests.servers import LocalServer

JOBS = "/batch/v1/jobs"
# Exponential in a backtracking engine (Python's `re` holds the GIL for its whole match);
# linear in RE2. 40 characters would take `re` longer than the age of the universe.
CATASTROPHIC = "^(a+)+$"
EVIL_TEXT = "a" * 40 + "!"

pytest_plugins = ["tests.engine_fixtures"]


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def remote_refs(server: LocalServer) -> list[dict[str, Any]]:
    """Schemas that point outside themselves: a URL (the metadata-service shape), a local
    file that never ends, and the dynamic-reference keyword."""
    return [
        {"type": "object", "properties": {"a": {"$ref": server.url("/latest/meta-data")}}},
        {"type": "object", "properties": {"a": {"$ref": "file:///dev/zero"}}},
        {"$defs": {"x": {"$dynamicRef": server.url("/tarpit#x")}}, "$ref": "#/$defs/x"},
    ]


def assert_untouched(server: LocalServer) -> None:
    # Not even a connection: a blind SSRF needs none of the response.
    assert (server.accepted, server.requests) == (0, [])


def while_other_work_ticks(check: Any) -> tuple[Any, float, int]:
    """What check() answers, in how many seconds, and how often other work on another
    thread ran meanwhile."""
    ticks = 0
    done = threading.Event()

    def other_work() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    other = threading.Thread(target=other_work)
    other.start()
    started = time.monotonic()
    try:
        result = check()
    finally:
        done.set()
        other.join()
    return result, time.monotonic() - started, ticks


# -- at submit: 400, nothing created, nothing fetched --------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_job_level_schema_that_refers_outside_itself_is_400(
        api: APIClient, organization: Organization, server: LocalServer, which: int) -> None:
    ready = input_ready(organization, b'{"custom_id":"r1","body":{}}\n')
    schema = remote_refs(server)[which]
    response = api.post(JOBS, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                               "response_format": json_schema(schema)}, format="json")
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("response_format.json_schema.schema.")
    assert "a reference must point inside the schema (start with '#')" in detail
    assert not Job.objects.exists()
    assert_untouched(server)


@pytest.mark.django_db
@pytest.mark.parametrize("response_format,message", [
    (json_schema({"type": "string", "pattern": "(?=a)b"}),
     "response_format.json_schema.schema.pattern '(?=a)b' cannot be used: patterns are "
     "matched with RE2 syntax"),
    (json_schema({"patternProperties": {r"(a)\1": {}}}),
     r"response_format.json_schema.schema.patternProperties key '(a)\\1' cannot be used"),
    (json_schema({"enum": ["x" * rf.MAX_BYTES]}),
     f"over the {rf.MAX_BYTES:,}-byte limit; shorten the schema."),
    (json_schema(json.loads('{"not":' * rf.MAX_DEPTH + "{}" + "}" * rf.MAX_DEPTH)),
     f"response_format nests objects and arrays more than {rf.MAX_DEPTH} levels deep"),
])
def test_unbounded_schemas_are_400(api: APIClient, organization: Organization,
                                   response_format: dict[str, Any], message: str) -> None:
    ready = input_ready(organization, b'{"custom_id":"r1","body":{}}\n')
    response = api.post(JOBS, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                               "response_format": response_format}, format="json")
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_schema_with_local_refs_and_re2_patterns_is_accepted(
        api: APIClient, organization: Organization) -> None:
    ready = input_ready(organization, b'{"custom_id":"r1","body":{}}\n')
    schema = {"$defs": {"code": {"type": "string", "pattern": CATASTROPHIC}},
              "type": "object", "properties": {"code": {"$ref": "#/$defs/code"}}}
    response = api.post(JOBS, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                               "response_format": json_schema(schema)}, format="json")
    assert response.status_code == 200, response.content


# -- in the row checks: the job fails naming the row, unbilled, nothing fetched -------------

def job_with_an_evil_row(api: APIClient, organization: Organization,
                         schema: dict[str, Any]) -> str:
    """A job submitted on two rows, the second ('evil') with its own schema."""
    line = {"method": "POST", "url": "/v1/chat/completions"}
    messages = [{"role": "user", "content": "hi"}]
    rows = [{**line, "custom_id": "fine", "body": {"messages": messages}},
            {**line, "custom_id": "evil", "body": {"messages": messages,
                                                   "response_format": json_schema(schema)}}]
    item = input_ready(organization, b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b",
                               "max_output_tokens": 100}, format="json")
    assert response.status_code == 200, response.content
    return str(response.json()["id"])


@pytest.mark.django_db
@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_rows_own_schema_that_refers_outside_itself_fails_the_job_naming_the_row(
        api: APIClient, organization: Organization, server: LocalServer, checkpoints: Path,
        which: int) -> None:
    before = credits_summary(organization=organization)
    job_id = job_with_an_evil_row(api, organization, remote_refs(server)[which])
    assert job_estimate(job_id=job_id) == JobStatus.FAILED
    body = api.get(f"{JOBS}/{job_id}").json()
    assert (body["status"], body["failure_code"]) == ("failed", "invalid_input")
    assert body["failure_reason"].startswith(
        "Row 'evil': response_format.json_schema.schema.")
    assert "a reference must point inside the schema" in body["failure_reason"]
    assert credits_summary(organization=organization) == before
    assert_untouched(server)


# -- the engine's check: bounded, never fetching, a failure is the row's format_error -------

@pytest.mark.parametrize("which", [0, 1, 2])
def test_the_engine_check_never_fetches_a_ref(server: LocalServer, which: int) -> None:
    # As if a row had reached the engine without the checks (an older job, a sample).
    assert _satisfies('{"a": "x"}', json_schema(remote_refs(server)[which])) is False
    assert_untouched(server)


def test_refs_that_resolve_against_a_remote_id_are_not_fetched(server: LocalServer) -> None:
    # '#' refs pass the check; an $id makes them relative to a URL. Still nothing leaves.
    for schema in ({"$id": server.url("/root/"), "properties": {"a": {"$ref": "#/$defs/x"}}},
                   {"properties": {"a": {"$id": server.url("/sub"), "$ref": "#/nope"}}},
                   {"$schema": server.url("/meta"), "type": "object"}):
        _satisfies('{"a": 1}', json_schema(schema))
    assert_untouched(server)


@pytest.mark.parametrize("schema,content", [
    ({"not": {"type": "string", "pattern": CATASTROPHIC}}, json.dumps(EVIL_TEXT)),
    ({"not": {"patternProperties": {CATASTROPHIC: {}}}}, json.dumps({EVIL_TEXT: 1})),
    ({"not": {"patternProperties": {CATASTROPHIC: {}}, "additionalProperties": False}},
     json.dumps({EVIL_TEXT: 1})),
    ({"not": {"patternProperties": {CATASTROPHIC: {}}, "unevaluatedProperties": False}},
     json.dumps({EVIL_TEXT: 1})),
    ({"not": {"propertyNames": {"pattern": CATASTROPHIC}}}, json.dumps({EVIL_TEXT: 1})),
    ({"uniqueItems": True}, json.dumps([{"n": n} for n in range(20_000)])),
])
def test_a_catastrophic_schema_does_not_freeze_the_engine_check(
        schema: dict[str, Any], content: str) -> None:
    # given another customer's work on the same worker process, ticking while the check
    # runs, when the attack's answer is checked
    result, took, ticks = while_other_work_ticks(
        lambda: _satisfies(content, json_schema(schema)))
    # then it is answered at once, and the other work ran meanwhile
    assert took < 2
    assert isinstance(result, bool)
    assert ticks > 0


def test_re2_semantics_match_the_schema(server: LocalServer) -> None:
    schema = {"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
              "additionalProperties": False,
              "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
    assert _satisfies('{"code": "ABC", "x-n": 1}', json_schema(schema)) is True
    assert _satisfies('{"code": "abc"}', json_schema(schema)) is False
    assert _satisfies('{"x-n": "one"}', json_schema(schema)) is False
    assert _satisfies('{"other": 1}', json_schema(schema)) is False
    assert _satisfies("[1, 1.0]", json_schema({"uniqueItems": True})) is False
    assert _satisfies("[1, true]", json_schema({"uniqueItems": True})) is True


@pytest.mark.parametrize("schema,content", [
    ({"type": "nonsense"}, "{}"),  # the library raises UnknownType
    ({"$ref": "#/$defs/missing"}, "{}"),  # an unresolvable local ref
    ({"type": "array"}, "[" * 100_000 + "]" * 100_000),  # recursion in the parser
    ({"multipleOf": 1e-308}, "1e308"),  # an overflow in the library
])
def test_any_exception_in_the_check_is_the_rows_format_error(schema: dict[str, Any],
                                                             content: str) -> None:
    assert _satisfies(content, json_schema(schema)) is False


@pytest.mark.engine
def test_the_engine_refuses_such_rows_alone_and_fetches_nothing(
        chat_engine: ChatEngine, server: LocalServer) -> None:
    user = [{"role": "user", "content": "Say hello in French."}]
    off = {"enable_thinking": False}
    rows = [ChatRow(messages=user, chat_template_kwargs=off, response_format=json_schema(s))
            for s in remote_refs(server)]
    rows.append(ChatRow(messages=user, chat_template_kwargs=off))
    outcomes = chat_engine.generate(rows, ChatSettings(max_tokens=8))
    *refused, plain = outcomes
    for outcome in refused:
        assert outcome.error is not None and outcome.error.param == "response_format"
        assert "a reference must point inside the schema" in outcome.error.message
    assert plain.error is None and plain.content is not None
    assert_untouched(server)



# -- issue 22, H2: a schema whose branches fan out (CWE-407) --------------------------------

def fan_out(levels: int, leaf: dict[str, Any] | None = None) -> dict[str, Any]:
    """The review's schema: each level's oneOf refers twice to the next, 2**(levels+1) - 1
    subschemas to check one answer from a few KB of JSON."""
    defs: dict[str, Any] = {f"d{i}": {"oneOf": [{"$ref": f"#/$defs/d{i + 1}"},
                                                {"$ref": f"#/$defs/d{i + 1}"}]}
                            for i in range(levels)}
    defs[f"d{levels}"] = leaf or {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def deep_recursion() -> dict[str, Any]:
    """Under the submit bound (the recursion is counted once), exponential in the answer's
    depth: each object level evaluates the next level twice."""
    level = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}
    return {"$defs": {"n": {"oneOf": [level, dict(level)]}}, "$ref": "#/$defs/n"}


def nested(depth: int) -> str:
    return '{"a":' * depth + "{}" + "}" * depth


@pytest.mark.django_db
def test_a_job_level_schema_that_fans_out_is_400_at_once(
        api: APIClient, organization: Organization) -> None:
    ready = input_ready(organization, b'{"custom_id":"r1","body":{}}\n')
    schema = fan_out(40)
    assert len(json.dumps(schema)) < 3_000
    started = time.monotonic()
    response = api.post(JOBS, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                               "response_format": json_schema(schema)}, format="json")
    assert time.monotonic() - started < 2
    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"response_format.json_schema.schema would take more than "
        f"{rf.MAX_EVALUATION_COST:,} steps to check one answer: its oneOf, anyOf, allOf and "
        "$ref branches multiply, and a long required or type list or properties object "
        "counts a step for every 16 entries each time it is visited. Refer to each shared "
        "definition from fewer places.")
    assert not Job.objects.exists()


def test_the_bound_counts_reuse_and_recursion_once() -> None:
    def cost(schema: dict[str, Any]) -> int:
        return rf._evaluation_cost(json.dumps(schema))

    # the root, then each level: its oneOf and two $ref objects, each visiting the next level
    d2 = 1 + 2 * (1 + 1)
    d1 = 1 + 2 * (1 + d2)
    assert cost(fan_out(3)) == 1 + (1 + 2 * (1 + d1))
    assert cost(fan_out(200)) == rf.MAX_EVALUATION_COST + 1  # saturated, not 2**201
    # a chain of thousands of references is legal and costs what it visits
    chain = {f"c{i}": {"$ref": f"#/$defs/c{i + 1}"} for i in range(3_000)}
    chain["c3000"] = {"type": "string"}
    assert cost({"$defs": chain, "$ref": "#/$defs/c0"}) == 3_002
    assert cost(deep_recursion()) == 8
    # the root, x, and x's reference back to itself counted once
    assert cost({"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}) == 3
    assert cost({"$ref": "#/$defs/missing"}) == 1


def test_a_schema_under_the_bound_with_shared_definitions_is_accepted() -> None:
    address = {"type": "object", "properties": {
        key: {"type": "string", "maxLength": 80} for key in ("street", "city", "zip")}}
    person = {"type": "object", "properties": {
        "name": {"type": "string"}, "home": {"$ref": "#/$defs/address"},
        "work": {"$ref": "#/$defs/address"}}, "required": ["name"]}
    schema = {"$defs": {"address": address, "person": person}, "type": "object",
              "properties": {"people": {"type": "array", "items": {"$ref": "#/$defs/person"}},
                             "owner": {"$ref": "#/$defs/person"}}}
    assert rf.response_format_problem(json_schema(schema)) is None
    answer = {"people": [{"name": "A", "home": {"city": "X"}}] * 50,
              "owner": {"name": "B", "work": {"zip": "1"}}}
    assert _satisfies(json.dumps(answer), json_schema(schema)) is True
    assert rf.response_format_problem(json_schema(fan_out(10))) is None
    assert rf.response_format_problem(json_schema(fan_out(12))) is not None


@pytest.mark.django_db
def test_a_rows_own_schema_that_fans_out_fails_the_job_naming_the_row(
        api: APIClient, organization: Organization, checkpoints: Path) -> None:
    before = credits_summary(organization=organization)
    job_id = job_with_an_evil_row(api, organization, fan_out(40))
    started = time.monotonic()
    assert job_estimate(job_id=job_id) == JobStatus.FAILED
    assert time.monotonic() - started < 10
    body = api.get(f"{JOBS}/{job_id}").json()
    assert (body["status"], body["failure_code"]) == ("failed", "invalid_input")
    assert body["failure_reason"].startswith(
        "Row 'evil': response_format.json_schema.schema would take more than 10,000 "
        "steps")
    assert credits_summary(organization=organization) == before


def test_the_engine_check_refuses_a_fan_out_that_reached_it_at_once() -> None:
    # As if a row had reached the engine without the checks (an older job, a sample).
    result, took, ticks = while_other_work_ticks(
        lambda: _satisfies("1", json_schema(fan_out(40))))
    assert (result, took < 2, ticks > 0) == (False, True, True)


def test_an_answer_past_the_step_budget_is_unsatisfied_and_bounded() -> None:
    schema = json_schema(deep_recursion())
    assert rf.response_format_problem(schema) is None  # passes every check before the engine
    # a shallow answer is checked as usual
    assert _satisfies(nested(3), schema) is False  # both branches match: not oneOf
    # when the answer is deep enough to take 2**40 steps
    result, took, ticks = while_other_work_ticks(lambda: _satisfies(nested(40), schema))
    # then the check stops at its budget: the row's format_error, in about a second, and
    # other work ran meanwhile
    assert result is False
    assert took < 10
    assert ticks > 0
    with pytest.raises(rf.EvaluationBudgetSpent):
        rf.json_schema_satisfied(json.loads(nested(40)), deep_recursion())


def test_the_budget_is_per_answer_and_an_answer_within_it_is_checked_in_full() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    assert rf.json_schema_satisfied(list(range(16_000)), schema) is True
    assert rf.json_schema_satisfied([*range(16_000), "x"], schema) is False
    with pytest.raises(rf.EvaluationBudgetSpent):
        rf.json_schema_satisfied(list(range(16_000)), schema, steps=1_000)
    # the spent budget was that answer's only: the next starts afresh
    assert rf.json_schema_satisfied(list(range(16_000)), schema) is True


# -- issue 40, H2: a step charged by the work it does -----------------------------------------

def cpu_seconds(check: Any) -> tuple[Any, float]:
    """What check() answers (or the exception it raises), and the CPU its thread spent:
    the work itself, whatever else this busy machine runs meanwhile."""
    started = time.thread_time()
    try:
        result = check()
    except Exception as error:
        result = error
    return result, time.thread_time() - started


def enum_fan_out() -> dict[str, Any]:
    """The review's schema: a 9,000-value enum referred to 400 times in an anyOf, 52 KB.
    jsonschema compared an answer's item with every value of every branch: 400 steps an
    item, 3.6 million comparisons (and each branch printed the 9,000 values when none
    matched), about 1.8 s an item here, 27 s for 20 items on the review's machine."""
    return {"$defs": {"e": {"enum": list(range(1000, 10_000))}}, "type": "array",
            "items": {"anyOf": [{"$ref": "#/$defs/e"}] * 400}}


NAMES = 6_000


def required_fan_out() -> dict[str, Any]:
    """The same shape over a list the check goes over whole at each visit: 6,000 names."""
    return {"$defs": {"r": {"required": [f"p{i}" for i in range(NAMES)]}}, "type": "array",
            "items": {"anyOf": [{"$ref": "#/$defs/r"}] * 400}}


@pytest.mark.django_db
def test_the_reviews_enum_schema_is_checked_in_milliseconds(
        api: APIClient, organization: Organization) -> None:
    schema = enum_fan_out()
    assert 50_000 < len(json.dumps(schema, separators=(",", ":"))) < rf.MAX_BYTES
    # At submit its weighted cost is the visits (802) and its enum's values hashed once
    # (9,001 nodes, a step for every 16): accepted, since an answer's check is now cheap.
    assert rf._evaluation_cost(json.dumps(schema)) == 802 + 9_001 // 16
    ready = input_ready(organization, b'{"custom_id":"r1","body":{}}\n')
    response = api.post(JOBS, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                               "response_format": json_schema(schema)}, format="json")
    assert response.status_code == 200, response.content
    # An answer's check: each enum a set of hashed values, built once per answer, then a
    # lookup per visit. Within 5,000 steps (a hundredth of an answer's budget), and a few
    # milliseconds of CPU where it took seconds.
    for answer, satisfied in (([-1] * 20, False), ([1000, 9999] * 10, True)):
        result, took = cpu_seconds(lambda a=answer: rf.json_schema_satisfied(a, schema,
                                                                             steps=5_000))
        assert result is satisfied
        assert took < 1.0
    # The engine's own check of the answer as generated text, the same
    assert _satisfies(json.dumps([-1] * 20), json_schema(schema)) is False


@pytest.mark.django_db
def test_a_schema_whose_long_list_is_visited_400_times_is_400_at_submit(
        api: APIClient, organization: Organization) -> None:
    schema = required_fan_out()
    assert len(json.dumps(schema, separators=(",", ":"))) < rf.MAX_BYTES
    # 400 visits of a 6,000-name list: 375 steps each, far past the bound, where the old
    # count (one per subschema visited) said 802
    assert rf._evaluation_cost(json.dumps(schema)) > rf.MAX_EVALUATION_COST
    ready = input_ready(organization, b'{"custom_id":"r1","body":{}}\n')
    response = api.post(JOBS, {"input_id": str(ready.pk), "model": "qwen3.8-27b",
                               "response_format": json_schema(schema)}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith(
        "response_format.json_schema.schema would take more than 10,000 steps to check one "
        "answer")
    assert "a long required or type list or properties object counts a step for every 16 " \
        "entries" in response.json()["detail"]
    assert not Job.objects.exists()


def test_the_evaluator_handed_such_a_schema_stops_within_its_budget() -> None:
    # As if the schema had reached the engine without the submit check: every name but
    # the last present, so each of the 400 branches goes over all of them, and fails
    answer = [{f"p{i}": 0 for i in range(NAMES - 1)}, 1]
    result, took = cpu_seconds(lambda: evaluate(answer, required_fan_out(),
                                                steps=rf.MAX_EVALUATION_STEPS, seconds=None))
    assert isinstance(result, rf.EvaluationBudgetSpent)
    assert took < 1.0


def test_an_answers_check_stops_at_its_cpu_time_whatever_its_steps() -> None:
    # The clock is the backstop: with steps to spare, the recursive schema's deep answer
    # (2**40 steps) stops at the time given
    answer = json.loads(nested(40))
    result, took = cpu_seconds(lambda: evaluate(answer, deep_recursion(), steps=10**12,
                                                seconds=0.2))
    assert isinstance(result, rf.EvaluationBudgetSpent)
    assert "more than 0.2 s" in str(result)
    assert took < 1.0
    # and by default an answer gets a second of its thread's CPU
    assert rf.MAX_EVALUATION_SECONDS == 1.0


# Random a's and b's: RE2's DFA gives up on the pattern below over them.
LONG = "".join(random.Random(1).choice("ab") for _ in range(128 * 1024))


@pytest.mark.parametrize("schema,answer", [
    # each branch's failing `false` printed the whole answer into its error (minutes)
    ({"anyOf": [False] * 3_000}, [{f"k{i}": "v" * 20 for i in range(5)}] * 2_000),
    # ... and so did each failing `type` (minutes)
    ({"anyOf": [{"type": "string"}] * 3_000}, [{f"k{i}": "v" * 20 for i in range(5)}] * 2_000),
    # a pattern RE2 runs without its DFA on a 128 KiB answer, 100 times (0.3 s each)
    ({"$defs": {"p": {"pattern": "[ab]*a[ab]{500}c"}}, "anyOf": [{"$ref": "#/$defs/p"}] * 100},
     LONG),
    # 300 patterns matched against 6,000 keys: 1.8 million searches in one keyword (2.5 s)
    ({"patternProperties": {f"^k{i}": {"type": "string"} for i in range(300)}},
     {f"k{i}": "v" for i in range(6_000)}),
    # jsonschema looked each index up in a list: quadratic in a long array (2.5 s)
    ({"contains": {"type": "integer"}, "unevaluatedItems": False},
     [*range(24_000), "x"]),
    # a whole-array hash, 500 times (2.3 s)
    ({"$defs": {"u": {"uniqueItems": True, "maxItems": 0}},
      "anyOf": [{"$ref": "#/$defs/u"}] * 500}, list(range(16_000))),
])
def test_each_keyword_pays_for_its_work_so_the_steps_alone_bound_an_answer(
        schema: dict[str, Any], answer: Any) -> None:
    # given no clock, only the step budget: each of these took seconds to minutes within
    # it when a keyword was a step whatever it did
    result, took = cpu_seconds(lambda: evaluate(answer, schema,
                                                steps=rf.MAX_EVALUATION_STEPS, seconds=None))
    # then the check ends (answered, or its budget spent) within about half a second of
    # CPU here (generous: 2 s), and with the clock as well, as the engine checks, within
    # its second
    assert isinstance(result, bool | rf.EvaluationBudgetSpent), result
    assert took < 2.0
    result, took = cpu_seconds(lambda: evaluate(answer, schema,
                                                steps=rf.MAX_EVALUATION_STEPS,
                                                seconds=rf.MAX_EVALUATION_SECONDS))
    assert isinstance(result, bool | rf.EvaluationBudgetSpent), result
    assert took < rf.MAX_EVALUATION_SECONDS + 0.25


def test_enum_and_const_keep_json_equality() -> None:
    # the hashed enum decides as jsonschema's `equal`: 1 == 1.0, true is not 1, key order
    # is free, arrays compare in order, a string is not a number
    values = [1, True, None, "1", [1, 2], {"a": 1, "b": [True]}, 2.5]
    schema = {"enum": values}
    for answer, satisfied in ((1.0, True), (True, True), (False, False), (0, False),
                              ("1", True), (None, True), ([1, 2], True), ([2, 1], False),
                              ({"b": [True], "a": 1.0}, True), ({"a": 1, "b": [1]}, False),
                              (2.5, True), ("2.5", False), ([1.0, 2.0], True)):
        assert rf.json_schema_satisfied(answer, schema) is satisfied, answer
        assert rf.json_schema_satisfied(answer, {"const": answer}) is True
    assert rf.json_schema_satisfied(1, {"const": True}) is False
    assert rf.json_schema_satisfied({"a": [1]}, {"const": {"a": [1.0]}}) is True
