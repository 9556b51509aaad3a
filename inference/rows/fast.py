"""The JSONL checker's fast lane for chat rows: a block of whole lines decoded at once into
typed structs (msgspec), checked and counted over the block, without a Python step per
rule per row.

It takes a block only when every line is a plainly valid row: one request object per line,
a non-empty custom_id, POST to /v1/chat/completions, messages of exactly a role and a
string content, chat_template_kwargs whose thinking settings pass the job's rules, no
response_format or exactly {"type": "json_object"}, every row fitting its context. The
types say most of that and the decoder checks it in C; a block with anything else (a blank
line, media, tool calls, a message with a name, a schema, a too-long row, a duplicate id)
is handed back and checked line by line (jobs/validation/lines.py), by the rules that name
the failing row. So the fast lane decides nothing the line-by-line checks would decide
differently: it adds the same sums for the same rows (tests/unit/test_validation_fast.py holds
the two lanes to the same report).
"""

from __future__ import annotations

from collections import Counter
from itertools import chain
from operator import attrgetter
from typing import Annotated, Literal

import msgspec
import numpy as np

from inference.rows.chat import MESSAGE_TEMPLATE_TOKENS, ROLES, row_thinking, template_kwargs
from inference.rows.core import CHAT, BlockCost, Counted, JobContext, RowRef, RowRejected

Role = Literal["system", "developer", "user", "assistant", "tool"]
assert set(Role.__args__) == set(ROLES)  # type: ignore[attr-defined]


class _Message(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    # Any other key (name, tool_calls, reasoning_content) may change the rendered prompt:
    # such a message goes line by line.
    role: Role
    content: str


class _TemplateKwargs(msgspec.Struct, frozen=True, gc=False):
    # UNSET (absent) and None (null) differ: a null setting still reaches the template and
    # keeps the job's own from filling in (template_kwargs). Other keys are left alone.
    # Frozen, so hashable: a block's rows are grouped by their settings in one Counter.
    enable_thinking: bool | msgspec.UnsetType | None = msgspec.UNSET
    reasoning_effort: str | msgspec.UnsetType | None = msgspec.UNSET


class _JsonMode(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: Literal["json_object"]


class _Body(msgspec.Struct, gc=False):
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    chat_template_kwargs: _TemplateKwargs | None = None
    response_format: _JsonMode | None = None


class _Request(msgspec.Struct, gc=False):
    custom_id: Annotated[str, msgspec.Meta(min_length=1)]
    method: Literal["POST"]
    url: Literal["/v1/chat/completions"]
    body: _Body


_DECODER = msgspec.json.Decoder(_Request)
_NEWLINE, _BRACE = ord("\n"), ord("{")
assert CHAT == "/v1/chat/completions"
# The structs are read a field at a time over the whole block (map in C, not a Python loop).
_BODY, _CUSTOM_ID = attrgetter("body"), attrgetter("custom_id")
_KWARGS, _RESPONSE_FORMAT = attrgetter("chat_template_kwargs"), attrgetter("response_format")
_MESSAGES, _CONTENT = attrgetter("messages"), attrgetter("content")


class _Thinking:
    """What a row's chat_template_kwargs (None: it has none) mean under the job: whether
    the row thinks, at which effort, and the template kwargs it renders with; `refused`
    when the rules refuse them (the line-by-line lane then names the row)."""

    __slots__ = ("effort", "kwargs", "refused", "thinking")

    def __init__(self, given: _TemplateKwargs | None, job: JobContext) -> None:
        own: dict[str, object] | None = None
        if given is not None:
            own = {name: value for name, value in
                   (("enable_thinking", given.enable_thinking),
                    ("reasoning_effort", given.reasoning_effort))
                   if value is not msgspec.UNSET}
        self.refused = False
        self.thinking, self.effort = False, None
        try:
            self.thinking, self.effort = row_thinking(own, job=job, row=RowRef("fast lane"))
        except RowRejected:
            self.refused = True
        self.kwargs = template_kwargs(own, reasoning=job.options.reasoning,
                                      effort=job.options.reasoning_effort)


class ChatFastRows:
    """The chat kind's fast lane for one job (TaskKind.fast_rows); one per file."""

    def __init__(self, job: JobContext) -> None:
        self.job = job
        self._settings: dict[_TemplateKwargs | None, _Thinking] = {}
        limit = job.model.context_tokens
        # A row fits when its input and the job's output cap fit the context (fit_check).
        self._input_max = limit - (job.options.max_output_tokens or 0)

    def prepare(self, chunk: bytes, lines: int) -> PreparedBlock | None:
        """Everything but the count: the block decoded and checked, and the texts its
        rows are counted by (each row's rendered prompt, or each message's text). Changes
        nothing, so it may run ahead of the blocks before it."""
        # Every line starts with its object's brace (JSON strings hold no raw newline):
        # no blank or whitespace-only line, which the decoder would skip and the
        # line-by-line lane refuses.
        data = np.frombuffer(chunk, np.uint8)
        if data[0] != _BRACE or ((data[:-1] == _NEWLINE) & (data[1:] != _BRACE)).any():
            return None
        try:
            requests = _DECODER.decode_lines(chunk)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        if len(requests) != lines:  # two objects on one line
            return None
        job = self.job
        bodies = list(map(_BODY, requests))
        groups = Counter(map(_KWARGS, bodies))
        settings = {kwargs: self._setting(kwargs) for kwargs in groups}
        if any(setting.refused for setting in settings.values()):
            return None
        conversations = list(map(_MESSAGES, bodies))
        sizes = None
        texts: list[Counted]
        if job.renders_chat:  # each row counted as the prompt the engine renders
            prompts = []
            for kwargs, messages in zip(map(_KWARGS, bodies), conversations, strict=True):
                prompt = job.chat_prompt(
                    [{"role": message.role, "content": message.content}
                     for message in messages], settings[kwargs].kwargs)
                if prompt is None:  # the template refuses it: counted line by line
                    return None
                prompts.append(prompt)
            # Measured whatever the block's size: a prompt carries the template's own text
            # beside its content.
            if max(prompt.chars for prompt in prompts) > job.unmeasured_chars:
                return None
            texts = [*prompts]
        else:  # each message's text, plus the template's few tokens around it
            plain = list(map(_CONTENT, chain.from_iterable(conversations)))
            sizes = np.fromiter(map(len, conversations), np.int64, len(conversations))
            # A text no longer than the block itself needs no measuring.
            if len(chunk) > job.unmeasured_chars and max(map(len, plain)) > job.unmeasured_chars:
                return None
            texts = [*plain]
        thinking, efforts = 0, Counter[str]()
        for kwargs, rows in groups.items():
            setting = settings[kwargs]
            if setting.thinking:
                thinking += rows
                if setting.effort is not None:
                    efforts[setting.effort] += rows
        return PreparedBlock(
            texts=texts, sizes=sizes, input_max=self._input_max,
            cost=BlockCost(
                identities=list(map(_CUSTOM_ID, requests)), input_tokens=0,
                max_input_tokens=0, context_limit=job.model.context_tokens,
                thinking_rows=thinking, effort_rows=efforts,
                response_format_rows=len(bodies) - list(map(_RESPONSE_FORMAT,
                                                            bodies)).count(None)))

    def _setting(self, given: _TemplateKwargs | None) -> _Thinking:
        setting = self._settings.get(given)
        if setting is None:
            setting = self._settings[given] = _Thinking(given, self.job)
        return setting


class PreparedBlock:
    """A block the fast lane has checked but not yet counted: `texts` go to the counter
    (possibly on another thread), and `cost` makes the block's sums of their counts."""

    __slots__ = ("_cost", "_input_max", "_sizes", "texts")

    def __init__(self, *, texts: list[Counted], sizes: np.ndarray | None, input_max: int,
                 cost: BlockCost) -> None:
        self.texts = texts
        self._sizes = sizes  # messages a row, where each message's text is counted
        self._input_max = input_max
        self._cost = cost

    def cost(self, counts: list[int]) -> BlockCost | None:
        """The block's sums, given each text's count; None when a row does not fit its
        context (the line-by-line lane then names it)."""
        totals = np.array(counts, np.int64)
        sizes = self._sizes
        if sizes is not None:  # each message's text, plus the template's few tokens
            starts = np.zeros(len(sizes), np.int64)
            np.cumsum(sizes[:-1], out=starts[1:])
            totals = np.add.reduceat(totals, starts) + MESSAGE_TEMPLATE_TOKENS * sizes
        largest = int(totals.max())
        if largest > self._input_max:
            return None
        cost = self._cost
        cost.input_tokens, cost.max_input_tokens = int(totals.sum()), largest
        return cost
