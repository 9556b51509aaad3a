"""The chat-template renderer (inference.chat_template.ChatTemplate): minijinja where the probe
corpus shows it renders a template as transformers' Jinja does, Jinja otherwise, and the
same prompt (or the same refusal) either way."""

from __future__ import annotations

import importlib.util
import random
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from inference.chat_template import RENDERING_ARGUMENTS, ChatTemplate
from inference.checkpoints import CHAT_TEMPLATE

pytest_plugins = ["tests.engine_fixtures"]

# Jinja, the reference renderer, is transformers' (installed with the engines, not by the
# fast tier's plain install); so is ChatTemplate's own.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers comes with the engines (make install-cpu)")

QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
MISTRAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3 = """\
{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
        + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

TOJSON = """\
{%- set meta = {"persona": "Zoë, 日本語 ✓",
                "thinking": enable_thinking is defined and enable_thinking,
                "effort": reasoning_effort | default("none"), "quote": "\\"q\\" <b> & \\\\"} %}
<|meta|>{{ meta | tojson }}
{{ meta | tojson(indent=2, sort_keys=True) }}
{{ meta | tojson(separators=(",", ":"), ensure_ascii=True) }}
{%- for message in messages %}
<|{{ message.role }}|>{{ message | tojson }}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- for call in message.tool_calls %}
<|call|>{{ call.function.name }} {{ call.function.arguments | tojson }}
{%- endfor %}
{%- endif %}
{%- endfor %}
<|assistant|>
"""

# Qwen3's public template (tools, the reversed scan for the last user query, reasoning split
# out of an assistant turn, tool calls with tojson'd arguments, the no-thinking switch).
QWEN3 = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string
           and not(message.content.startswith('<tool_response>')
                   and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')
                                                   .split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n'
                    + reasoning_content.strip('\\n') + '\\n</think>\\n\\n'
                    + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

REALISTIC = {
    "tiny-qwen3": (CHAT_TEMPLATE, QWEN_TOKENS),
    "chatml": (CHATML, QWEN_TOKENS),
    "llama3": (LLAMA3, LLAMA_TOKENS),
    "mistral": (MISTRAL, MISTRAL_TOKENS),
    "tojson": (TOJSON, QWEN_TOKENS),
    "qwen3": (QWEN3, QWEN_TOKENS),
}

TRICKY = (
    "Say hello in French.", "  padded  ", "\n\nnewlines around\n\n", "\t tab\r\n", "",
    "<think>\nreasoning\n</think>\n\nanswer", "no open tag </think> after", "</think>",
    "<think>", 'say "hi"', "it's", "C:\\dir\\new", "\\n is not a newline", "\\\\", "{{ x }}",
    "{% if true %}tag{% endif %}", "{# c #}", "}}{{", "{%", "%}", "héllo wörld", "日本語のテキスト",
    "مرحبا", "emoji 🙂👍🏽🇫🇷‍", "\u200b zero width", "<|im_end|>", "<|im_start|>user",
    "<tool_response>\nx\n</tool_response>", "None", "True", "  ", "\n", "x" * 20_000,
)
ROLES = ("system", "developer", "user", "assistant", "tool")


def jinja_render(source: str, special: dict[str, str], messages: list[dict[str, Any]],
                 kwargs: dict[str, Any]) -> str:
    """The reference: transformers' compiled Jinja template, rendered as render renders it
    (the renderer before minijinja)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    own = {key: value for key, value in kwargs.items()
           if key.isidentifier() and key not in RENDERING_ARGUMENTS}
    return str(_compile_jinja_template(source).render(
        messages=messages, tools=None, documents=None, add_generation_prompt=True,
        **{**special, **own}))


def outcome(render: Any, *args: Any) -> tuple[str, str]:
    try:
        return "rendered", render(*args)
    except Exception as error:
        return "refused", type(error).__name__


def random_text(rng: random.Random) -> str:
    parts = rng.sample(TRICKY[:-1], rng.randint(1, 3))
    if rng.random() < 0.2:
        parts.append("".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 40))))
    if rng.random() < 0.02:
        parts.append(TRICKY[-1])
    return rng.choice(("", " ", "\n")).join(parts)


def random_message(rng: random.Random, role: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role}
    shape = rng.random()
    if shape < 0.15:
        message["content"] = [{"type": "text", "text": random_text(rng)}
                              for _ in range(rng.randint(1, 3))]
    elif role == "assistant" and shape < 0.3:
        message["content"] = rng.choice((None, "", random_text(rng)))
        arguments: Any = rng.choice(('{"city": "Zürich"}', {"q": random_text(rng)}, {}))
        message["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {
            "name": rng.choice(("weather", "search")), "arguments": arguments}}
            for i in range(rng.randint(1, 2))]
    else:
        message["content"] = random_text(rng)
    if role == "tool" and rng.random() < 0.5:
        message["tool_call_id"] = "call_0"
    if rng.random() < 0.05:
        message["name"] = "ana"
    return message


def random_kwargs(rng: random.Random) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if rng.random() < 0.7:
        kwargs["enable_thinking"] = rng.choice((True, False, None))
    if rng.random() < 0.5:
        kwargs["reasoning_effort"] = rng.choice(("low", "medium", "high", ""))
    if rng.random() < 0.2:  # never reach the template: rendering arguments, odd keys
        kwargs[rng.choice(sorted(RENDERING_ARGUMENTS))] = False
        kwargs["not an identifier"] = "x"
    if rng.random() < 0.2:
        kwargs[rng.choice(("custom", "date_string", "persona"))] = rng.choice(
            ("1 Jan 2025", 3, True, ["a", "é"], {"k": "v"}, None))
    return kwargs


def random_conversations(seed: int, count: int) -> list[tuple[list[dict[str, Any]],
                                                              dict[str, Any]]]:
    rng = random.Random(seed)
    conversations = []
    for _ in range(count):
        if rng.random() < 0.5:  # alternating, as most templates expect
            roles = ["system"] * (rng.random() < 0.5) + [
                ("user", "assistant")[at % 2] for at in range(rng.randint(1, 4))]
        else:
            roles = [rng.choice(ROLES) for _ in range(rng.randint(1, 5))]
        conversations.append(([random_message(rng, role) for role in roles],
                              random_kwargs(rng)))
    return conversations


@pytest.mark.parametrize("name", sorted(REALISTIC))
def test_realistic_templates_render_with_minijinja_exactly_as_jinja(name: str) -> None:
    source, special = REALISTIC[name]
    template = ChatTemplate(source, special)
    assert template.engine_name == "minijinja"
    rendered = 0
    seed = sorted(REALISTIC).index(name)
    for at, (messages, kwargs) in enumerate(random_conversations(seed, 400)):
        ours = outcome(template.render, messages, kwargs)
        theirs = outcome(jinja_render, source, special, messages, kwargs)
        assert ours == theirs, (at, messages, kwargs)
        rendered += ours[0] == "rendered"
    assert rendered >= 50  # the corpus reaches past the templates' refusals


def test_the_tiny_qwen3_checkpoint_renders_as_apply_chat_template(
        checkpoint_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    template = ChatTemplate.of_checkpoint(checkpoint_dirs["tiny-qwen3"])
    assert template is not None and template.engine_name == "minijinja"
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint_dirs["tiny-qwen3"]))
    for messages, kwargs in random_conversations(7, 300):
        own = {key: value for key, value in kwargs.items()
               if key.isidentifier() and key not in RENDERING_ARGUMENTS}
        expected = outcome(lambda m, k: tokenizer.apply_chat_template(
            m, tokenize=False, add_generation_prompt=True, **k), messages, own)
        assert outcome(template.render, messages, kwargs) == expected, (messages, kwargs)


def test_the_rendering_arguments_never_come_from_a_row() -> None:
    template = ChatTemplate(CHAT_TEMPLATE, QWEN_TOKENS)
    messages = [{"role": "user", "content": "hi"}]
    plain = template.render(messages, {})
    assert plain.endswith("<|im_start|>assistant\n<think>\n")
    overridden = {"add_generation_prompt": False, "messages": [], "tools": [{"x": 1}],
                  "documents": [], "not-an-identifier": 1}
    assert template.render(messages, overridden) == plain


def test_a_generation_tag_falls_back_to_jinja() -> None:
    # transformers' own tag for assistant masks: minijinja cannot compile it.
    source = ("{% for message in messages %}{% if message.role == 'assistant' %}"
              "{% generation %}{{ message.content }}{% endgeneration %}"
              "{% else %}{{ message.content }}{% endif %}{% endfor %}")
    template = ChatTemplate(source, {})
    assert template.engine_name == "jinja"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert template.render(messages, {}) == "qa"


def test_a_template_minijinja_prints_differently_falls_back_to_jinja() -> None:
    # Python writes 1e-07 where minijinja writes 0.0000001.
    source = "{{ messages|length * 1e-7 }}{% for m in messages %}{{ m.content }}{% endfor %}"
    template = ChatTemplate(source, {})
    assert template.engine_name == "jinja"
    assert template.render([{"role": "user", "content": "x"}], {}) == "1e-07x"


def test_a_template_minijinja_mostly_cannot_render_falls_back_to_jinja() -> None:
    # wordcount is Jinja's, not minijinja's: every render would be done twice.
    source = "{% for m in messages %}{{ m.content|string|wordcount }} {% endfor %}"
    template = ChatTemplate(source, {})
    assert template.engine_name == "jinja"
    assert template.render([{"role": "user", "content": "two words"}], {}) == "2 "


def test_raise_exception_still_refuses_the_row_under_minijinja() -> None:
    from jinja2 import TemplateError

    template = ChatTemplate(MISTRAL, MISTRAL_TOKENS)
    assert template.engine_name == "minijinja"
    assert template.render([{"role": "user", "content": "hi"}], {}) == "<s>[INST] hi [/INST]"
    with pytest.raises(TemplateError, match="roles must alternate"):
        template.render([{"role": "assistant", "content": "hi"}], {})
    with pytest.raises(TemplateError, match="Only user and assistant"):
        template.render([{"role": "user", "content": "hi"},
                         {"role": "tool", "content": "hi"}], {})


def test_a_row_only_minijinja_cannot_render_gets_jinjas_prompt() -> None:
    # A branch no probe takes: minijinja has no wordcount filter, so it fails this row alone.
    source = ("{% for m in messages %}{% if m.content == 'count these words' %}"
              "{{ m.content|wordcount }}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    template = ChatTemplate(source, {})
    assert template.engine_name == "minijinja"
    assert template.render([{"role": "user", "content": "count these words"}], {}) == "3"
    assert template.render([{"role": "user", "content": "plain"}], {}) == "plain"


def test_tojson_of_none_or_undefined_is_left_to_jinja() -> None:
    # minijinja hands a filter an undefined value as None, where Jinja's tojson raises on
    # undefined and writes null for None: Jinja decides both.
    source = "{{ messages[0].extra | tojson }}|{{ custom | tojson }}"
    template = ChatTemplate(source, {})
    assert template.engine_name == "minijinja"  # every probe refused, as Jinja refuses it
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TypeError):
        template.render(messages, {"custom": 1})
    assert template.render([{**messages[0], "extra": None}], {"custom": None}) == "null|null"
    assert template.render([{**messages[0], "extra": {"é": [1]}}], {"custom": "x"}) \
        == '{"é": [1]}|"x"'


def test_the_int_filter_on_undefined_still_refuses() -> None:
    from jinja2 import UndefinedError

    source = "{{ messages[0].content|int }}{{ custom|int }}"
    template = ChatTemplate(source, {})
    assert template.engine_name == "minijinja"
    messages = [{"role": "user", "content": "42"}]
    assert template.render(messages, {"custom": "0x1A"}) == "420"
    assert template.render(messages, {"custom": None}) == "420"
    with pytest.raises(UndefinedError):
        template.render(messages, {})


def test_strftime_now_reads_the_clock() -> None:
    template = ChatTemplate(LLAMA3, LLAMA_TOKENS)
    assert template.engine_name == "minijinja"
    today = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {today}\n" in template.render([{"role": "user", "content": "hi"}], {})
