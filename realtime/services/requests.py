"""The two realtime requests, POST /realtime/v1/embeddings and POST /realtime/v1/systemone:
each checked by its model's task kind, counted, admitted (realtime.services.admission),
forwarded to an engine server (realtime.engine_client), and billed what the engine read
(realtime.services.settlement), in that order (realtime.services)."""

from __future__ import annotations

import base64
import logging
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from anex.errors import EngineFailed, Invalid, Malformed, Unavailable
from anex.regions import Region
from console.models import ApiKey
from inference.catalog import CatalogModel
from inference.engines import DecisionOutcome
from inference.kinds.decide import DecideKind, answer_body
from inference.kinds.embed import EmbedKind, EmbedRequest, embeddings_body
from inference.rows.decisions import question_text, state_text
from realtime.checks import encoding_format_check, realtime_model_require
from realtime.concurrency import Admission
from realtime.constants import Endpoint
from realtime.engine_client import (
    EngineAtCapacity,
    EngineRefused,
    EngineTimedOut,
    EngineUnavailable,
    engine_call,
)
from realtime.services.admission import (
    Counted,
    realtime_open_require,
    region_require,
    request_admitted,
)
from realtime.services.settlement import realtime_usage_bill

logger = logging.getLogger(__name__)

ENGINE_FAILED_DETAIL = ("The {what} service failed to answer, so nothing was billed. Retry; "
                        "if it persists, contact support with the X-Anex-Request-ID header "
                        "of this response.")
ENGINE_AT_CAPACITY_DETAIL = ("The {what} service is at capacity and did not take this "
                             "request, so nothing was done and nothing was billed. Retry "
                             "after the seconds in the Retry-After header.")
ENGINE_AT_CAPACITY_RETRY_AFTER_SECONDS = 1
ENGINE_TIMED_OUT_DETAIL = ("The {what} service took this request but did not answer within "
                           "{seconds} seconds. Its work is billed ({tokens} input tokens); "
                           "retry, and if it persists, contact support with the "
                           "X-Anex-Request-ID header of this response.")
# The markers a tokenizer may add around a text (MiniLM's [CLS] and [SEP]) and an
# end-of-text token: added to a byte count to bound a text's tokens from above.
MARKER_TOKENS = 3


def _forward(*, urls: tuple[str, ...], path: str, body: dict[str, Any], what: str,
             on_timeout: Callable[[], int]) -> dict[str, Any]:
    """The engine's answer. A request the engine took but did not answer in time did the
    work: `on_timeout` bills it (its tokens), and the answer is 502 saying so."""
    try:
        return engine_call(urls=urls, path=path, body=body)
    except EngineAtCapacity as exc:
        logger.warning("realtime %s engine busy: %s", what, type(exc).__name__)
        raise Unavailable(ENGINE_AT_CAPACITY_DETAIL.format(what=what),
                          retry_after=ENGINE_AT_CAPACITY_RETRY_AFTER_SECONDS) from None
    except EngineTimedOut:
        tokens = on_timeout()
        raise EngineFailed(ENGINE_TIMED_OUT_DETAIL.format(
            what=what, seconds=settings.ANEX_REALTIME_TIMEOUT_SECONDS,
            tokens=f"{tokens:,}")) from None
    except (EngineUnavailable, EngineRefused) as exc:
        # The class only: an engine's refusal may quote the request (anex.logsafe).
        logger.error("realtime %s engine failed: %s", what, type(exc).__name__)
        raise EngineFailed(ENGINE_FAILED_DETAIL.format(what=what)) from None


@contextmanager
def _answered(*, key: ApiKey, model: CatalogModel, counted: Counted, urls: tuple[str, ...],
              path: str, endpoint: Endpoint, body: dict[str, Any]
              ) -> Iterator[tuple[dict[str, Any], Admission]]:
    """Admit the request, forward it, and hold its admission while the block bills the
    answer; a request the engine took and did not answer in time bills its counted
    tokens (_forward)."""
    with request_admitted(key=key, model=model, counted=counted) as admission:
        def bill_taken() -> int:
            realtime_usage_bill(key=key, endpoint=endpoint, model=model,
                                input_tokens=counted.taken, admission=admission)
            return counted.taken

        what = "embedding" if endpoint == Endpoint.EMBEDDINGS else "decision"
        yield (_forward(urls=urls, path=path, body=body, what=what, on_timeout=bill_taken),
               admission)


# -- the requests --------------------------------------------------------------------------

@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    input: Any
    dimensions: int | None = None
    encoding_format: str | None = None


def _embeddings_counted(model: CatalogModel, checked: EmbedRequest) -> Counted:
    if checked.prompt_tokens is not None:
        exact = sum(checked.prompt_tokens)
        return Counted(exact=exact, most=exact, taken=exact)
    # No tokenizer here: the engine refuses an input past the context, so that is the most
    # any input can bill. Realtime takes text only (its checks refuse content parts); a
    # row of parts would be taken at that most.
    context = model.context_tokens
    return Counted(exact=None, most=context * len(checked.rows),
                   taken=sum(min(context, len(row.text.encode()) + MARKER_TOKENS)
                             if isinstance(row.text, str) else context
                             for row in checked.rows))


def realtime_embeddings_create(*, key: ApiKey, host_region: Region,
                               request: EmbeddingsRequest) -> dict[str, Any]:
    """POST /realtime/v1/embeddings: OpenAI's response shape, unit-length vectors (as
    floats, or base64 of little-endian float32 when asked for)."""
    realtime_open_require()
    model, kind, urls = realtime_model_require(model_id=request.model, key=key, kind=EmbedKind)
    region_require(key=key, host_region=host_region)
    encoding_format_check(request.encoding_format)
    # Counted here with the model's tokenizer, an input past the context refused (400
    # naming it) before any engine reads the request.
    checked = kind.realtime_request(model, request.input, dimensions=request.dimensions)
    counted = _embeddings_counted(model, checked)
    with _answered(key=key, model=model, counted=counted, urls=urls, path=kind.endpoint,
                   endpoint=Endpoint.EMBEDDINGS, body=checked.forward(model.id)
                   ) as (answer, admission):
        items = answer.get("data")
        if not isinstance(items, list) or len(items) != len(checked.rows) \
                or not all(isinstance(item, dict) for item in items):
            raise EngineFailed(ENGINE_FAILED_DETAIL.format(what="embedding"))
        read = [min(int(item.get("prompt_tokens") or 0), model.context_tokens)
                for item in items]
        refused = next((index for index, item in enumerate(items) if "error" in item), None)
        if refused is not None:
            # The model's own refusal of one input (longer than its context), which only an
            # engine without a tokenizer here can make: the request is refused naming the
            # input, and what the engine read of the others is billed.
            realtime_usage_bill(key=key, endpoint=Endpoint.EMBEDDINGS, model=model,
                                input_tokens=sum(read), admission=admission)
            raise Invalid(f"input[{refused}]: {items[refused]['error'].get('message')}")
        # What the engine says it read, never less than what was counted here.
        tokens = max(sum(read), counted.exact or 0)
        realtime_usage_bill(key=key, endpoint=Endpoint.EMBEDDINGS, model=model,
                            input_tokens=tokens, admission=admission)
    vectors = [item["embedding"] for item in items]
    if request.encoding_format == "base64":
        return embeddings_body(model.id, [base64_vector(v) for v in vectors], tokens)
    return embeddings_body(model.id, vectors, tokens)


def base64_vector(vector: list[float]) -> str:
    """A vector as OpenAI's base64 encoding spells it: little-endian float32, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _decision_most(body: dict[str, Any]) -> int:
    """The most a decision can bill without a tokenizer here: the batch row's rule (the
    text once per question, plus each question's words) with each piece's byte count, an
    upper bound on any tokenizer's count of it."""
    text = state_text(body.get("state")) or ""
    questions = body.get("questions")
    assert isinstance(questions, dict)  # the kind checked it
    return sum(len(text.encode()) + MARKER_TOKENS
               + len(question_text(q).encode()) + MARKER_TOKENS
               for q in questions.values() if isinstance(q, dict)) or MARKER_TOKENS


def _step_failed_detail(param: object) -> str:
    name = param.removeprefix("questions.") if isinstance(param, str) else None
    which = f"question '{name}'" if name else "a question"
    return (f"The decision service failed on {which} of this request (the model failed on "
            "it, and again when it was run alone), so no question was answered and nothing "
            "was billed. Retry; if it persists, contact support with the X-Anex-Request-ID "
            "header of this response.")


def realtime_decision_create(*, key: ApiKey, host_region: Region,
                             body: dict[str, Any]) -> dict[str, Any]:
    """POST /realtime/v1/systemone: the reference's answers, usage and routing."""
    realtime_open_require()
    model_id = body.get("model")
    if not isinstance(model_id, str) or not model_id:
        raise Malformed("model: This field is required: the decision model's id (laya).")
    model, kind, urls = realtime_model_require(model_id=model_id, key=key, kind=DecideKind)
    region_require(key=key, host_region=host_region)
    checked = kind.realtime_request(model, body)
    most = checked.input_tokens if checked.input_tokens is not None else _decision_most(body)
    counted = Counted(exact=checked.input_tokens, most=most, taken=most)
    with _answered(key=key, model=model, counted=counted, urls=urls, path=kind.endpoint,
                   endpoint=Endpoint.SYSTEMONE, body=checked.forward(model.id)
                   ) as (answer, admission):
        error = answer.get("error")
        if isinstance(error, dict) and error.get("type") == "server_error":
            # The engine's step failed on one of this request's questions, in its batch and
            # again alone (feed.py): the engine's failure, not the caller's. The request
            # fails closed, as its batch row would: no question is answered and nothing is
            # billed (docs/realtime.md, "POST /systemone"; issue 40 L14).
            # (Not the question's name in the log: it is the customer's text.)
            logger.error("realtime decision engine failed on a question of the request")
            raise EngineFailed(_step_failed_detail(error.get("param")))
        if isinstance(error, dict):
            # A question the model refuses: 422 with the model's own message, naming it.
            # The engine checks the questions before it reads the text: nothing to bill.
            raise Malformed(str(error.get("message")))
        if not isinstance(answer.get("answers"), dict):
            raise EngineFailed(ENGINE_FAILED_DETAIL.format(what="decision"))
        read = int(answer.get("input_tokens") or 0)
        tokens = max(read, counted.exact) if counted.exact is not None else min(read, most)
        outcome = DecisionOutcome(answers=answer["answers"], input_tokens=tokens,
                                  routing=answer["routing"])
        realtime_usage_bill(key=key, endpoint=Endpoint.SYSTEMONE, model=model,
                            input_tokens=outcome.input_tokens, admission=admission)
    return answer_body(model.id, outcome)
