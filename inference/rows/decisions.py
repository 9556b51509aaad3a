"""Decision rows (/v1/systemone): a state and typed questions about it.

Only what the reference fails up front is refused here: a body field beyond state,
questions, lang and model, more questions than the model takes, a state over its character
limit, and a row whose shape leaves nothing to count (no state, no questions object). What
is wrong inside one question (options over the 192-token budget, a noul criteria key other
than true/false, missing instructions, an unknown type) is the model's to refuse: that fails
the row alone at serving time, so it passes here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from inference.rows.core import JobContext, RowCost, RowRef, thousands

DECISION_FIELDS = ("state", "questions", "lang", "model")


def decision_row(body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
    model = job.model
    for name in body:
        if name not in DECISION_FIELDS:
            raise row.reject(f"unknown field '{name}': a decision row's body carries only "
                             "state, questions, lang and model")
    state = body.get("state")
    text = state_text(state)
    if text is None:
        raise row.reject("state must be the text to decide on: a string or a JSON object")
    rendered = "" if isinstance(state, str) else " as JSON"
    limit = model.max_state_chars
    if limit is not None and len(text) > limit:
        raise row.reject(f"state is {thousands(len(text))} characters{rendered}, over the "
                         f"{thousands(limit)}-character limit", limit=True)
    questions = body.get("questions")
    if not isinstance(questions, dict) or not questions:
        raise row.reject("questions must be an object of named questions")
    most = model.max_questions
    if most is not None and len(questions) > most:
        raise row.reject_sentence(f"has {len(questions)} questions, over the "
                                  f"{most}-question limit of model '{model.id}'", limit=True)
    lang = body.get("lang")
    if lang is not None and not isinstance(lang, str):
        raise row.reject("lang must be a language code such as \"de\"")
    count = job.count_tokens
    # The reference: "for each question, the text plus that question's instructions and
    # option texts, summed over the questions". The full text is counted even where the
    # model reads only its first context_tokens: an estimate never runs short.
    tokens = count(text) * len(questions)
    for question in questions.values():
        # A question the model cannot take (not even an object) fails its row at serving
        # time and bills nothing; until then it is counted for what it carries.
        own = question_text(question) if isinstance(question, dict) else ""
        if own:
            tokens += count(own)
    return RowCost(text_tokens=tokens, questions=len(questions))


def state_text(state: object) -> str | None:
    """The text a decision row (or realtime request) is read and billed as: a string as it
    is, an object as its compact, unescaped JSON rendering (the reference: "an object
    counts as its JSON rendering"); None for anything else. The validator measures this
    against the state limit and counts it, the engine reads it."""
    if isinstance(state, str):
        return state
    if isinstance(state, dict):
        return json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return None


def answer_described(answer: str, description: object) -> str:
    return f"{answer}: {description}" if isinstance(description, str) and description \
        else answer


def question_text(question: Mapping[str, object]) -> str:
    """A question's own words, as a row's estimate counts them and its serving bills them:
    the instructions, then each option as "key: description" (the key alone when it has
    no description; a score level's description alone), one per line."""
    pieces: list[str] = []
    instructions = question.get("instructions")
    if isinstance(instructions, str):
        pieces.append(instructions)
    criteria = question.get("criteria")
    if isinstance(criteria, dict):
        pieces += [f"{k}: {v}" if isinstance(v, str) else str(k) for k, v in criteria.items()]
    elif isinstance(criteria, list):
        pieces += [item for item in criteria if isinstance(item, str)]
    return "\n".join(pieces)
