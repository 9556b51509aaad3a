"""A checkpoint's chat template, rendered as the chat engine and the row checker both
render it (inference.tokens counts what it renders).

Two renderers, one answer. The reference renderer is transformers' sandboxed Jinja
environment, as apply_chat_template compiles a template. The row checker renders every text
row at estimate time, where Jinja's ~40 us a row is most of the check, so a template is also
compiled with minijinja (Rust, several times faster), set up as transformers sets up Jinja.
Which one renders a template is decided once, when it is loaded: minijinja only if it
compiles the template and every prompt of a fixed probe corpus (every role, one to four
turns, the thinking kwargs, awkward strings, text parts, tool calls) comes out byte for byte
as Jinja's, refusals included; otherwise Jinja alone (ChatTemplate.engine_name says which).
At render time a minijinja error never decides: Jinja renders the row again, so a row is
refused only where Jinja refuses it, with Jinja's own error.

What a row's prompt is made of (ChatTemplate.prompt, docs/output-format.md "Special tokens in
content"): the template's own text (scaffolding: role headers, turn markers, the generation
prompt), where its markup is the model's special tokens, and the conversation's strings
(content), which are always text. The template never sees a content string: it renders the
messages with each string replaced by a stand-in, and the rendered text is cut at the
stand-ins. So `<|im_end|>` in a message is the text `<|im_end|>`, never a turn's end, and
nothing the template decides (where a trace opens, what it strips) reads a customer's
string. Since the rendering then depends only on the conversation's shape (its roles, its
keys, which strings are empty) and the kwargs, it is remembered per shape: a file of rows
of one shape renders once.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cache, partial
from pathlib import Path
from typing import Any, NoReturn

import minijinja

logger = logging.getLogger(__name__)

TokenCounter = Callable[[str], int]

# The special tokens a template sees by name, as transformers' apply_chat_template passes
# them (its special_tokens_map).
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                   "cls_token", "mask_token")
# Arguments of the rendering itself: a row's chat_template_kwargs never stands in for one.
RENDERING_ARGUMENTS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "messages",
})

# A content string's stand-in: its number between two Unicode noncharacters (reserved for a
# program's internal use, so no template's text carries them).
_OPEN, _CLOSE = "\ufdd0", "\ufdd1"
_STAND_IN = re.compile(f"{_OPEN}([0-9]+){_CLOSE}")
# The keys whose string values a template compares with its own words ("user", "text",
# "function") rather than prints: these stay as they are, when they look like such a word.
_STRUCTURAL = frozenset({"role", "type"})
# A dict key (or a structural value) a template could name: kept as it is. Any other key
# (one holding `<`, `|`, `[`...) stands in like a value, as it is data to the template.
_NAME = re.compile(r"[A-Za-z0-9_.\- ]*")
# Shapes remembered per template (each a few short strings); emptied when full.
LAYOUTS_MAX = 4096


class _Slot:
    """A stand-in's place in a conversation's shape (the memo's key)."""


_SLOT = _Slot()


@dataclass(frozen=True, slots=True, eq=False)
class PromptLayout:
    """A rendered conversation shape: the template's text around the stand-ins
    (`scaffolding`, one more than the gaps) and which string fills each gap (`slots`, an
    index into the conversation's strings: a string may be printed twice or not at all).
    Compared by identity: one object per shape in a template's memo, so a counter may
    remember what its scaffolding counts."""

    scaffolding: tuple[str, ...]
    slots: tuple[int, ...]

    def opens_trace(self, open_marker: str, close_marker: str) -> bool:
        """The template's own text leaves a trace open: its last `open_marker` comes after
        its last `close_marker`. Read off the scaffolding alone, never off content."""
        opened = closed = (-1, -1)
        for at, segment in enumerate(self.scaffolding):
            start, end = segment.rfind(open_marker), segment.rfind(close_marker)
            if start >= 0:
                opened = (at, start)
            if end >= 0:
                closed = (at, end)
        return opened > closed


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A row's prompt: its layout, and the conversation's strings that fill it. `parts`
    alternate scaffolding and content (scaffolding first and last); the engine encodes
    the scaffolding with the model's special tokens and the content as plain text
    (inference.tokens.ModelTokens.encode_prompts), and the row checker counts it so."""

    layout: PromptLayout
    strings: tuple[str, ...]

    @property
    def content(self) -> list[str]:
        strings = self.strings
        return [strings[slot] for slot in self.layout.slots]

    @property
    def parts(self) -> list[str]:
        parts = [self.layout.scaffolding[0]]
        for text, segment in zip(self.content, self.layout.scaffolding[1:], strict=True):
            parts += (text, segment)
        return parts

    @property
    def text(self) -> str:
        """The prompt as one text (what a reader sees; never what is encoded)."""
        return "".join(self.parts)

    @property
    def chars(self) -> int:
        return sum(map(len, self.layout.scaffolding)) + sum(map(len, self.content))

    def opens_trace(self, open_marker: str, close_marker: str) -> bool:
        return self.layout.opens_trace(open_marker, close_marker)


class ChatTemplate:
    """A checkpoint's chat template, compiled once: by transformers' own sandboxed Jinja
    environment (as apply_chat_template compiles it), and by minijinja, which renders it
    where the probe corpus shows the two agree (engine_name)."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self._template = _compile_jinja_template(source)
        self._special = special_tokens
        # Each conversation shape's layout (prompt). A template that reads the clock
        # renders anew each time; one whose own text holds the stand-in markers renders no
        # prompt at all (it could not be cut safely).
        self._layouts: dict[object, PromptLayout] = {}
        self._remembers = "strftime_now" not in source
        self._marked = _OPEN in source or _CLOSE in source
        self._fast = _fast_compiled(source)
        if self._fast is not None and not self._agrees_on_probes(self._fast):
            self._fast = None

    @property
    def engine_name(self) -> str:
        """The renderer this template's rows go through: "minijinja" or "jinja"."""
        return "jinja" if self._fast is None else "minijinja"

    @classmethod
    def of_checkpoint(cls, checkpoint: Path) -> ChatTemplate | None:
        """The checkpoint's template (chat_template.jinja, else tokenizer_config.json's
        chat_template); None when it has none."""
        config_path = checkpoint / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) \
            if config_path.is_file() else {}
        source_path = checkpoint / "chat_template.jinja"
        source = source_path.read_text() if source_path.is_file() \
            else config.get("chat_template")
        if not isinstance(source, str):
            return None
        special = {name: _token_text(config.get(name)) for name in _SPECIAL_TOKENS}
        return cls(source, {name: text for name, text in special.items() if text is not None})

    def render(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        """The prompt text of these messages under a row's template kwargs, ready for the
        assistant's turn. Raises whatever the template raises for messages it refuses."""
        own = {key: value for key, value in kwargs.items()
               if key.isidentifier() and key not in RENDERING_ARGUMENTS}
        return self._render(messages, {**self._special, **own})

    def prompt(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> ChatPrompt:
        """The row's prompt as scaffolding and content (ChatPrompt): the template rendered
        over the messages with every string a stand-in, cut at the stand-ins. Raises
        whatever the template raises, and ValueError where the template altered a
        stand-in (sliced, escaped or re-cased it), which no prompt can be cut from."""
        strings: list[str] = []
        shaped, shape = _stood_in_messages(messages, strings)
        own = {key: value for key, value in kwargs.items()
               if key.isidentifier() and key not in RENDERING_ARGUMENTS}
        key: object = None
        if self._remembers:
            try:
                key = (shape, tuple(sorted(own.items())))
                layout = self._layouts.get(key)
            except TypeError:  # an unhashable kwarg: rendered, not remembered
                key = layout = None
            if layout is not None:
                return ChatPrompt(layout, tuple(strings))
        layout = self._layout(self._render(shaped, {**self._special, **own}), len(strings))
        if key is not None:
            if len(self._layouts) >= LAYOUTS_MAX:
                self._layouts.clear()
            self._layouts[key] = layout
        return ChatPrompt(layout, tuple(strings))

    def _layout(self, rendered: str, strings: int) -> PromptLayout:
        cut = _STAND_IN.split(rendered)
        scaffolding, slots = tuple(cut[::2]), tuple(map(int, cut[1::2]))
        if self._marked or any(_OPEN in segment or _CLOSE in segment for segment in scaffolding) \
                or any(slot >= strings for slot in slots):
            raise ValueError("the chat template altered a message's text where it should "
                             "print it whole")
        return PromptLayout(scaffolding, slots)

    def _render(self, messages: list[dict[str, Any]], variables: dict[str, Any]) -> str:
        if self._fast is not None:
            try:
                return _fast_render(self._fast, messages, variables)
            except BaseException as error:
                _reraise_interrupt(error)
                # Jinja decides: its prompt where only minijinja failed, else its own refusal.
        return self._jinja(messages, variables)

    def _jinja(self, messages: list[dict[str, Any]], variables: dict[str, Any]) -> str:
        return str(self._template.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=True, **variables))

    def _agrees_on_probes(self, fast: minijinja.Environment) -> bool:
        """Every probe renders (or is refused) exactly as Jinja renders it, as render's
        callers see it; and minijinja renders most of them itself, since each one it leaves
        to Jinja costs both renders."""
        retried = rendered = 0
        for messages, kwargs in _probes():
            # One fixed clock for both: a template printing today's date would otherwise
            # differ across midnight between the two renders.
            variables = {**self._special, **kwargs, "strftime_now": _probe_strftime}
            expected = _outcome(self._jinja, messages, variables)
            native = _outcome(partial(_fast_render, fast), messages, variables)
            if expected is not None:
                rendered += 1
                retried += native is None
            if native is not None and native != expected:
                logger.info("chat template rendered by Jinja: minijinja differs on a probe "
                            "(%d messages, kwargs %s)", len(messages), kwargs)
                return False
        if retried * 4 > rendered:
            logger.info("chat template rendered by Jinja: minijinja fails %d of the %d "
                        "probes Jinja renders", retried, rendered)
            return False
        return True


def _stood_in_messages(messages: Any, strings: list[str]) -> tuple[Any, Any]:
    """_stood_in over a list of messages, the common message (a role and a string content,
    nothing else) taken without the general walk: the row checker renders every row."""
    if type(messages) is not list:
        return _stood_in(messages, strings)
    shaped: list[Any] = []
    shape: list[Any] = ["messages"]
    for message in messages:
        if type(message) is dict and len(message) == 2:
            role, content = message.get("role"), message.get("content")
            if type(role) is str and type(content) is str and _named(role):
                keys = tuple(message)
                if content:
                    strings.append(content)
                    content = f"{_OPEN}{len(strings) - 1}{_CLOSE}"
                shaped.append({"role": role, "content": content} if keys[0] == "role"
                              else {"content": content, "role": role})
                shape.append((keys, role, bool(content)))
                continue
        item, inner = _stood_in(message, strings)
        shaped.append(item)
        shape.append(inner)
    return shaped, tuple(shape)


def _named(text: str) -> bool:
    """Whether text looks like a name a template uses (_NAME), remembered: the few role
    words and keys of a file come back on every row."""
    known = _NAMES.get(text)
    if known is None:
        known = _NAME.fullmatch(text) is not None
        if len(_NAMES) < 4096:
            _NAMES[text] = known
    return known


_NAMES: dict[str, bool] = {}


def _stood_in(value: Any, strings: list[str], structural: bool = False) -> tuple[Any, Any]:
    """The value with every string a numbered stand-in (appended to `strings`), and its
    shape (hashable: what the rendering depends on). Kept as they are: empty strings (a
    template tests them), a role's or a type's value that looks like a word (a template
    compares them), dict keys that look like names (a template looks them up), numbers,
    booleans and nulls."""
    kind = type(value)
    if kind is str:
        if not value or (structural and _named(value)):
            return value, value
        strings.append(value)
        return f"{_OPEN}{len(strings) - 1}{_CLOSE}", _SLOT
    if kind is dict:
        shaped: dict[Any, Any] = {}
        shape: list[Any] = []
        for key, item in value.items():
            name = key if type(key) is str and _named(key) else None
            if name is None:
                name, _ = _stood_in(str(key), strings)
            shaped[name], inner = _stood_in(item, strings, key in _STRUCTURAL)
            shape.append((name if name == key else _SLOT, inner))
        return shaped, ("{", *shape)
    if kind is list or kind is tuple:
        items = [_stood_in(item, strings) for item in value]
        return [item for item, _ in items], ("[", *(inner for _, inner in items))
    return value, (kind, value)


# -- minijinja, set up as transformers sets up Jinja (chat_template_utils,
# _cached_compile_jinja_template) -------------------------------------------------------------

_FAST_NAME = "chat"  # no extension: minijinja escapes nothing, as the sandbox does not


class _Ambiguous(ValueError):
    """A value minijinja hands a Python filter as None may have been undefined in the
    template, where Jinja raises rather than rendering None: Jinja renders that row."""


def _fast_compiled(source: str) -> minijinja.Environment | None:
    """The template compiled by minijinja; None where it cannot compile it (a syntax it
    lacks, such as transformers' {% generation %} tag)."""
    environment = minijinja.Environment(
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
        # Python's string and dict methods (.split, .lstrip, .startswith, .items, ...),
        # and Python's spelling of printed values (None, True, ['a']).
        pycompat=True,
        # Jinja's default Undefined: printed empty, iterated empty, falsy; an attribute of
        # it raises.
        undefined_behavior="lenient",
        auto_escape_callback=_no_escaping, debug=False,
        filters={"tojson": _fast_tojson, "int": _fast_int},
        globals={"raise_exception": _raise_exception, "strftime_now": _strftime_now})
    try:
        environment.add_template(_FAST_NAME, source)
    except minijinja.TemplateError as error:
        logger.info("chat template rendered by Jinja: minijinja cannot compile it (%s)",
                    str(error).splitlines()[0])
        return None
    return environment


def _fast_render(environment: minijinja.Environment, messages: list[dict[str, Any]],
                 variables: dict[str, Any]) -> str:
    return environment.render_template(_FAST_NAME, messages=messages, tools=None,
                                       documents=None, add_generation_prompt=True, **variables)


def _no_escaping(name: str) -> bool:
    return False


def _fast_tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
                 separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' tojson: json.dumps, not Jinja's HTML-escaping filter. Jinja raises on an
    # undefined value (not JSON serializable), which minijinja passes here as None.
    if value is None:
        raise _Ambiguous("tojson of None or of an undefined value")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _fast_int(value: Any, default: int = 0, base: int = 10) -> int:
    # Jinja's int filter raises on an undefined value; minijinja's would print 0.
    from jinja2.filters import do_int

    if value is None:
        raise _Ambiguous("int of None or of an undefined value")
    return do_int(value, default, base)


def _raise_exception(message: str) -> NoReturn:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _probe_strftime(format: str) -> str:
    return _PROBE_CLOCK.strftime(format)


_PROBE_CLOCK = datetime(2025, 3, 14, 15, 9, 26)


def _outcome(render: Callable[[list[dict[str, Any]], dict[str, Any]], str],
             messages: list[dict[str, Any]], variables: dict[str, Any]) -> str | None:
    """The rendered prompt, or None where the template refused it."""
    try:
        return render(messages, variables)
    except BaseException as error:
        _reraise_interrupt(error)
        return None


def _reraise_interrupt(error: BaseException) -> None:
    # A panic inside minijinja reaches Python as pyo3's PanicException, a BaseException
    # like KeyboardInterrupt: it is a failed render, the interrupts are not.
    if isinstance(error, KeyboardInterrupt | SystemExit | GeneratorExit):
        raise error


# -- the probe corpus: what a row may carry (inference.rows.chat), in every role --------------

_PROBE_TEXTS = (
    "Say hello in French.",
    "  padded on both sides  \n",
    "\n\nleading newlines, and a trailing one\n",
    "<think>\nweighing it up\n</think>\n\nThe answer.",
    "an open trace </think>\n\nthen the reply",
    "quotes: \"double\", 'single', `back`",
    "backslashes: C:\\path\\new \\n \\t \\\\ \\u00e9",
    "braces: {{ not_a_variable }} {% if x %}not a tag{% endif %} {# nor a comment #} }}{{",
    "non-ASCII: héllo wörld ß, 日本語, مرحبا, emoji 🙂👍🏽🇫🇷",
    "",
    "long " * 5000,
)
_PROBE_ROLES = (
    ("user",), ("system",), ("assistant",), ("tool",),
    ("system", "user"), ("developer", "user"), ("user", "assistant"), ("user", "user"),
    ("user", "assistant", "user"), ("system", "developer", "user"),
    ("system", "user", "assistant", "user"), ("developer", "user", "assistant", "tool"),
    ("user", "assistant", "tool", "user"), ("system", "user", "user", "assistant"),
)
_PROBE_KWARGS: tuple[dict[str, Any], ...] = (
    {}, {"enable_thinking": True}, {"enable_thinking": False}, {"reasoning_effort": "high"},
    {"enable_thinking": True, "reasoning_effort": "low"},
    {"enable_thinking": False, "reasoning_effort": "medium"},
)


@cache
def _probes() -> tuple[tuple[list[dict[str, Any]], dict[str, Any]], ...]:
    """Every text in every position of every role sequence, the kwargs taken in turn (each
    sequence meets every variant); each sequence again with text parts and with every
    variant; and tool calls, their results and named turns."""
    texts, variants = len(_PROBE_TEXTS), len(_PROBE_KWARGS)
    probes: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    for roles in _PROBE_ROLES:
        for shift in range(texts):
            messages: list[dict[str, Any]] = [
                {"role": role, "content": _PROBE_TEXTS[(shift + at) % texts]}
                for at, role in enumerate(roles)]
            probes.append((messages, _PROBE_KWARGS[len(probes) % variants]))
        parted = [{"role": role, "content": [
            {"type": "text", "text": _PROBE_TEXTS[(at + 3) % texts]},
            {"type": "text", "text": " and a second part"}]} for at, role in enumerate(roles)]
        probes.extend((parted, kwargs) for kwargs in _PROBE_KWARGS)
    calls: list[dict[str, Any]] = [{"id": "call_1", "type": "function", "function": {
        "name": "weather", "arguments": '{"city": "Zürich", "unit": "c"}'}},
        {"id": "call_2", "type": "function", "function": {
            "name": "time", "arguments": {"zone": "Europe/Zürich", "quote": "\"q\" \\"}}}]
    for content in (None, "", "Let me look.", "<think>\nwhich tool\n</think>\n\nLooking."):
        messages = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Weather in Zürich?", "name": "ana"},
            {"role": "assistant", "content": content, "tool_calls": calls},
            {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1",
             "name": "weather"},
        ]
        probes.extend((messages, kwargs) for kwargs in _PROBE_KWARGS)
    # And each as the prompts are rendered (ChatTemplate.prompt): with stand-ins, every
    # shape once.
    shapes: dict[object, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    for messages, kwargs in probes:
        shaped, shape = _stood_in_messages(messages, [])
        shapes.setdefault((shape, tuple(sorted(kwargs.items()))), (shaped, kwargs))
    return (*probes, *shapes.values())


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None
