"""The decision model (laya): typed questions about a text, answered in one pass with a
probability per option and no generated text (the reference's "Decision jobs" and
"Realtime decisions").

How a question is answered: the text, then the question and its options each behind a
one-token label (A, B, …), are rendered through the checkpoint's chat template with
thinking off, and encoded as a chat row's prompt is (inference.tokens.ModelTokens
.encode_prompts: the template's markup as special tokens, the text and the question as text,
so a text holding `<|im_end|>` cannot end its turn); the model's next-token
log-probabilities of the labels, renormalised over the labels, are the option
probabilities. Every question of every row of a chunk is one prompt
of one engine run through the checkpoint's feed (feed.py; max_tokens=1, logprob_token_ids =
the labels): nothing is generated that anyone reads. The text comes first in each prompt,
so a row's questions share their prefix and prefix caching reads the text once.

Routing: a row's text goes to the "english" checkpoint when the row's lang is one that
checkpoint reads, or, without a lang, when its letters are mostly Latin script; otherwise
to "multilingual". A checkpoint directory may carry routing.json, {"english": DIR,
"multilingual": DIR} (relative to it); without one both routes read the directory itself,
as the embedded default does (both routes are tiny-qwen3).
"""

from __future__ import annotations

import json
import math
import string
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from inference.engines.feed import EngineFeed, RequestFailed
from inference.engines.runtime import feed_of, llm_load
from inference.engines.types import DecisionOutcome, DecisionRow, RowError, RowRefused
from inference.rows.decisions import answer_described, question_text, state_text
from inference.tokens import ModelTokens, checkpoint_tokens

ENGLISH = "english"
MULTILINGUAL = "multilingual"
ROUTES = (ENGLISH, MULTILINGUAL)
ROUTING_FILE = "routing.json"
# Languages the english checkpoint reads: English and the Western European languages that
# share its script and most of its vocabulary. Any other lang goes to multilingual.
ENGLISH_LANGS = frozenset({"en", "de", "fr", "es", "it", "pt", "nl", "da", "sv", "no", "nb",
                           "nn", "ca", "ga", "is", "fi"})
LATIN_SHARE = 0.5  # above this share of Latin letters a text without lang reads as english

QUESTION_TYPES = ("choice", "noul", "score")
NOUL_KEYS = ("true", "false")
LABELS = string.ascii_uppercase + string.ascii_lowercase + string.digits
INSTRUCTIONS_TOKENS = 256  # the most of a question's instructions the model reads
DECISION_MAX_MODEL_LEN = 2048
SYSTEM_PROMPT = ("Read the text, then answer the question about it with the label of exactly "
                 "one option.")


@dataclass(frozen=True)
class _Question:
    name: str
    type: str
    instructions: str
    keys: list[str]  # the answer's option keys: criteria keys, "true"/"false", "0".."n-1"
    texts: list[str]  # what the model reads for each option (within the option budget)
    billed_text: str  # instructions and option texts, as the estimator counts them
    legend: dict[str, str] = field(default_factory=dict)


@dataclass
class _Reader:
    """One routed checkpoint: its engine, tokenizer and single-token labels."""

    llm: Any
    feed: EngineFeed  # shared with the chat engine on the same checkpoint (feed.py)
    tokenizer: Any
    tokens: ModelTokens  # its template and the encoders a chat row's prompt is encoded with
    labels: list[tuple[str, int]]
    max_model_len: int


class DecisionEngine:
    def __init__(self, *, model_id: str, checkpoint: Path, context_tokens: int,
                 option_budget_tokens: int, max_questions: int | None = None) -> None:
        self.model_id = model_id
        self.checkpoint = checkpoint
        self.context_tokens = context_tokens
        self.option_budget = option_budget_tokens
        self.max_questions = max_questions
        self.routes = _routes(checkpoint)
        readers: dict[Path, _Reader] = {}
        self.readers: dict[str, _Reader] = {}
        self.load_seconds = 0.0
        for route, path in self.routes.items():
            if path not in readers:
                readers[path] = self._reader(path)
            self.readers[route] = readers[path]
        # Billing counts with the model's own tokenizer.json, the file the estimator counts
        # with (inference/tokens.py), so a row bills what its estimate said it would.
        billing = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        self.count: Callable[[str], int] = lambda text: len(
            billing.encode(text, add_special_tokens=False).ids)

    def _reader(self, path: Path) -> _Reader:
        loaded = llm_load(path, runner="generate", max_model_len=_model_len(path),
                          reasoning_parser="qwen3")
        self.load_seconds += loaded.seconds
        tokenizer = loaded.llm.get_tokenizer()
        tokens = checkpoint_tokens(path)
        if tokens is None or tokens.template is None:
            raise RuntimeError(f"checkpoint {path} has no tokenizer.json and chat template: "
                               "its prompts could not be encoded")
        labels = []
        for label in LABELS:
            ids = tokenizer.encode(label, add_special_tokens=False)
            if len(ids) == 1:
                labels.append((label, int(ids[0])))
        return _Reader(llm=loaded.llm, feed=feed_of(loaded), tokenizer=tokenizer, tokens=tokens,
                       labels=labels,
                       max_model_len=int(loaded.llm.model_config.max_model_len))

    # -- the chunk --------------------------------------------------------------------------

    def decide(self, rows: list[DecisionRow]) -> list[DecisionOutcome]:
        outcomes: list[DecisionOutcome | None] = [None] * len(rows)
        # per reader: (row index, question, prompt ids)
        batches: dict[int, list[tuple[int, _Question, list[int]]]] = {}
        readers: dict[int, _Reader] = {}
        plans: dict[int, tuple[list[_Question], dict[str, str], int]] = {}
        for index, row in enumerate(rows):
            text = state_text(row.state)
            routing = route_for(text if text is not None else "", row.lang)
            try:
                if text is None:
                    raise RowRefused(RowError.invalid_request(
                        "state must be the text to decide on: a string or a JSON object",
                        param="state"))
                reader = self.readers[routing["model"]]
                questions = self._questions(row, reader)
                read = self._text_read(text, reader)
                billed = sum(self.count(read) + self.count(q.billed_text) for q in questions)
                prompts = [self._prompt(read, question, reader) for question in questions]
            except RowRefused as refused:
                outcomes[index] = DecisionOutcome(answers=None, input_tokens=0,
                                                  routing=routing, error=refused.error)
                continue
            plans[index] = (questions, routing, billed)
            readers[id(reader)] = reader
            batches.setdefault(id(reader), []).extend(
                (index, question, prompt) for question, prompt in zip(questions, prompts,
                                                                      strict=True))
        answers: dict[int, dict[str, dict[str, Any]]] = {index: {} for index in plans}
        # Rows a question of which the engine failed on alone, and that question: the row
        # fails closed (docs/dev/decisions/2026-12-02-failure-classes-and-the-breaker.md, "A failed
        # engine step"): none of its questions is answered and nothing of it is billed, in a batch
        # result row as in a realtime request (502), as a question the model refuses fails its whole
        # row.
        failed: dict[int, str] = {}
        for key, batch in batches.items():
            reader = readers[key]
            for (index, question, _), probabilities in zip(
                    batch, self._score(reader, batch), strict=True):
                if probabilities is None:
                    failed.setdefault(index, question.name)
                else:
                    answers[index][question.name] = _answer(question, probabilities)
        for index, (questions, routing, billed) in plans.items():
            if index in failed:
                error = RowError.engine_failed(param=f"questions.{failed[index]}")
                outcomes[index] = DecisionOutcome(answers=None, input_tokens=0,
                                                  routing=routing, error=error)
                continue
            ordered = {q.name: answers[index][q.name] for q in questions}
            outcomes[index] = DecisionOutcome(answers=ordered, input_tokens=billed,
                                              routing=routing)
        return [outcome for outcome in outcomes if outcome is not None]

    def _score(self, reader: _Reader,
               batch: list[tuple[int, _Question, list[int]]]) -> list[list[float] | None]:
        """Each prompt's probabilities per option; None where the engine's step failed on
        that prompt alone (feed.py's RequestFailed: its row fails, the others are answered)."""
        from vllm import SamplingParams

        params = [SamplingParams(max_tokens=1, temperature=0.0,
                                 logprob_token_ids=[t for _, t in
                                                    reader.labels[:len(question.keys)]])
                  for _, question, _ in batch]
        results = reader.feed.run([{"prompt_token_ids": prompt} for _, _, prompt in batch],
                                  params)
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, RequestFailed):
                raise result  # not the row's fault: the chunk fails and is retried
        scored: list[list[float] | None] = []
        for (_, question, _), result in zip(batch, results, strict=True):
            if isinstance(result, RequestFailed):
                scored.append(None)
                continue
            logprobs = result.outputs[0].logprobs[0]
            values = [logprobs[t].logprob for _, t in reader.labels[:len(question.keys)]]
            top = max(values)
            weights = [math.exp(v - top) for v in values]
            total = math.fsum(weights)
            scored.append([w / total for w in weights])
        return scored

    # -- one row ----------------------------------------------------------------------------

    def _text_read(self, text: str, reader: _Reader) -> str:
        """The text cut to the model's context (the reference: a longer text is cut)."""
        return self._cut(text, self.context_tokens, reader)

    def _questions(self, row: DecisionRow, reader: _Reader) -> list[_Question]:
        if not isinstance(row.questions, dict) or not row.questions:
            raise RowRefused(RowError.invalid_request(
                "questions must be an object of named questions", param="questions"))
        if self.max_questions is not None and len(row.questions) > self.max_questions:
            raise RowRefused(RowError.invalid_request(
                f"This row has {len(row.questions)} questions, over the "
                f"{self.max_questions}-question limit of model '{self.model_id}'.",
                param="questions"))
        return [self._question(str(name), raw, reader) for name, raw in row.questions.items()]

    def _question(self, name: str, raw: object, reader: _Reader) -> _Question:
        def refuse(message: str) -> RowRefused:
            return RowRefused(RowError.invalid_request(
                f"Question '{name}' {message}", code="invalid_question",
                param=f"questions.{name}"))

        if not isinstance(raw, dict):
            raise refuse("must be an object with a type, instructions and criteria.")
        kind = raw.get("type")
        if kind not in QUESTION_TYPES:
            raise refuse(f"has type {kind!r}: a question's type is choice, noul or score.")
        instructions = raw.get("instructions")
        if not isinstance(instructions, str) or not instructions.strip():
            raise refuse("has no instructions: every question needs its instructions, the "
                         "question itself.")
        criteria = raw.get("criteria")
        options: list[tuple[str, str]]  # (answer key, what the model reads for it)
        legend: dict[str, str] = {}
        if kind == "choice":
            if not isinstance(criteria, dict) or len(criteria) < 2 or not all(
                    isinstance(v, str) for v in criteria.values()):
                raise refuse("is a choice: its criteria must be an object of at least two "
                             "option keys, each with a description (a string).")
            options = [(str(k), f"{k}: {v}" if v else str(k)) for k, v in criteria.items()]
        elif kind == "noul":
            criteria = {} if criteria is None else criteria
            if not isinstance(criteria, dict):
                raise refuse("is a noul: its criteria, when set, are an object keyed true "
                             "and false.")
            strange = [str(k) for k in criteria if k not in NOUL_KEYS]
            if strange:
                raise refuse(f"is a noul: its criteria are keyed true and false only, not "
                             f"{', '.join(repr(k) for k in strange)}.")
            if not all(isinstance(v, str) for v in criteria.values()):
                raise refuse("is a noul: each of its criteria is a description (a string).")
            options = [("true", answer_described("yes", criteria.get("true"))),
                       ("false", answer_described("no", criteria.get("false")))]
        else:
            if not isinstance(criteria, list) or len(criteria) < 2 or not all(
                    isinstance(v, str) for v in criteria):
                raise refuse("is a score: its criteria must be a list of at least two level "
                             "descriptions, lowest first.")
            options = [(str(i), f"level {i}: {v}" if v else f"level {i}")
                       for i, v in enumerate(criteria)]
            legend = {str(i): v for i, v in enumerate(criteria)}
        texts = self._fit_options(options, reader, refuse)
        return _Question(
            name=name, type=kind, instructions=self._cut(instructions, INSTRUCTIONS_TOKENS,
                                                          reader),
            keys=[key for key, _ in options], texts=texts,
            billed_text=question_text(raw), legend=legend)

    def _fit_options(self, options: list[tuple[str, str]], reader: _Reader,
                     refuse: Callable[[str], RowRefused]) -> list[str]:
        """The reference's option budget: the options' texts share option_budget tokens,
        so each reads at most its share; a set whose keys alone do not fit is refused."""
        count = len(options)
        share = self.option_budget // count
        most = min(len(reader.labels), self.option_budget)
        if count > most or share < 1:
            raise refuse(f"has {count} options; at most {most} fit the "
                         f"{self.option_budget}-token option budget.")
        texts = []
        for key, text in options:
            need = len(reader.tokenizer.encode(key, add_special_tokens=False))
            if need > share:
                raise refuse(
                    f"does not fit the {self.option_budget}-token option budget: its {count} "
                    f"options read at most {share} tokens each, and option '{key}' needs "
                    f"{need} for its key alone. Use fewer or shorter options.")
            texts.append(self._cut(text, share, reader))
        return texts

    def _cut(self, text: str, tokens: int, reader: _Reader) -> str:
        """The text's first `tokens` tokens, counted as the prompt encodes it (as text)."""
        ids = reader.tokens.content_tokenizer.encode(text, add_special_tokens=False).ids
        return text if len(ids) <= tokens else str(reader.tokenizer.decode(ids[:tokens]))

    def _prompt(self, text: str, question: _Question, reader: _Reader) -> list[int]:
        messages = question_messages(text, question.instructions, list(zip(
            [label for label, _ in reader.labels], question.texts, strict=False)))
        template = reader.tokens.template
        assert template is not None  # _reader loads none without one
        [ids] = reader.tokens.encode_prompts([template.prompt(messages,
                                                              {"enable_thinking": False})])
        if len(ids) >= reader.max_model_len:
            raise RowRefused(RowError.invalid_request(
                f"Question '{question.name}' does not fit the model's context with its text.",
                code="invalid_question", param=f"questions.{question.name}"))
        return ids


def question_messages(text: str, instructions: str,
                      options: list[tuple[str, str]]) -> list[dict[str, str]]:
    """The conversation one question is read as, options given as (label, text). The local
    checkpoint is trained on conversations built here (inference/checkpoints.py)."""
    lines = [f"Text:\n{text}", "", f"Question: {instructions}", "Options:"]
    lines += [f"{label}. {option}" for label, option in options]
    lines.append("Answer with the label of one option.")
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "\n".join(lines)}]


# -- routing -------------------------------------------------------------------------------

def route_for(text: str, lang: str | None) -> dict[str, str]:
    """The reference's routing block: which checkpoint reads the row, and why."""
    if isinstance(lang, str) and lang.strip():
        base = lang.strip().lower().replace("_", "-").split("-")[0]
        if base in ENGLISH_LANGS:
            return {"model": ENGLISH, "reason": f"lang '{lang}' is read by the english "
                                                "checkpoint"}
        return {"model": MULTILINGUAL, "reason": f"lang '{lang}' is read by the multilingual "
                                                 "checkpoint"}
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return {"model": ENGLISH, "reason": "no letters to tell the script by; read as Latin "
                                            "script"}
    latin = sum(1 for c in letters if unicodedata.name(c, "").startswith("LATIN"))
    share = latin / len(letters)
    if share > LATIN_SHARE:
        return {"model": ENGLISH, "reason": f"text is {share:.0%} Latin script"}
    return {"model": MULTILINGUAL, "reason": f"text is {1 - share:.0%} non-Latin script"}


def _routes(checkpoint: Path) -> dict[str, Path]:
    manifest = checkpoint / ROUTING_FILE
    if not manifest.is_file():
        return dict.fromkeys(ROUTES, checkpoint.resolve())
    routes = json.loads(manifest.read_text())
    if not isinstance(routes, dict) or set(routes) != set(ROUTES):
        raise ValueError(f"{manifest} must name exactly the checkpoints {list(ROUTES)}")
    return {route: (checkpoint / str(routes[route])).resolve() for route in ROUTES}


def _model_len(checkpoint: Path) -> int:
    try:
        config = json.loads((checkpoint / "config.json").read_text())
        positions = int(config.get("max_position_embeddings") or DECISION_MAX_MODEL_LEN)
    except (OSError, ValueError):
        positions = DECISION_MAX_MODEL_LEN
    return min(positions, DECISION_MAX_MODEL_LEN)


# -- answers -------------------------------------------------------------------------------

def _round(value: float) -> float:
    return round(value, 4)


def _answer(question: _Question, probabilities: list[float]) -> dict[str, Any]:
    """The reference's answer shape. confidence is how concentrated the distribution is:
    on a choice the lead of the top option over the runner-up, on a noul the larger of the
    two probabilities (as the reference defines it), on a score one minus the spread of
    the levels (standard deviation over the largest a scale that long can have).
    answer_confidence is the probability of the reported answer."""
    if question.type == "noul":
        yes = probabilities[0]
        sure = max(yes, 1.0 - yes)
        return {"type": "noul", "noul": _round(yes), "confidence": _round(sure),
                "answer_confidence": _round(sure)}
    by_key = dict(zip(question.keys, probabilities, strict=True))
    if question.type == "choice":
        ranked = sorted(probabilities, reverse=True)
        choice = max(question.keys, key=lambda k: by_key[k])
        return {"type": "choice", "choice": choice,
                "probabilities": {k: _round(p) for k, p in by_key.items()},
                "confidence": _round(ranked[0] - ranked[1]),
                "answer_confidence": _round(by_key[choice])}
    levels = len(probabilities)
    expected = math.fsum(i * p for i, p in enumerate(probabilities))
    spread = math.sqrt(max(0.0, math.fsum((i - expected) ** 2 * p
                                          for i, p in enumerate(probabilities))))
    widest = (levels - 1) / 2
    nearest = min(max(round(expected), 0), levels - 1)
    return {"type": "score", "score": _round(expected), "legend": question.legend,
            "probabilities": {k: _round(p) for k, p in by_key.items()},
            "confidence": _round(1.0 - spread / widest if widest else 1.0),
            "answer_confidence": _round(probabilities[nearest])}
