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
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
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


class ChatTemplate:
    """A checkpoint's chat template, compiled once: by transformers' own sandboxed Jinja
    environment (as apply_chat_template compiles it), and by minijinja, which renders it
    where the probe corpus shows the two agree (engine_name)."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self._template = _compile_jinja_template(source)
        self._special = special_tokens
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
    return tuple(probes)


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None
