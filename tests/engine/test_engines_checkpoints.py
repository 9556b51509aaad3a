"""The local checkpoints (`manage.py build_checkpoints`), the catalog's local entries, and
engine_for's configuration rules."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from pytest_django import Settings
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from inference.catalog import catalog, local_models, model_get
from inference.checkpoints import (
    SPECIAL_TOKENS,
    STAMP,
    THINK_TOKENS,
    anex_checkpoints_value,
    checkpoints_build,
)
from inference.engines import (
    ChatEngine,
    DecisionEngine,
    EmbeddingEngine,
    EngineNotConfigured,
)
from inference.engines.chat import BUDGET_NOTICE
from inference.engines.runtime import llm_load
from inference.kinds import engine_for, kind_for
from inference.kinds.chat import ChatKind
from inference.kinds.embed import EmbedKind
from inference.tokens import token_counter

pytest_plugins = ["tests.engine_fixtures"]


def test_tiny_qwen3_has_qwens_special_tokens_as_single_tokens(
        checkpoint_dirs: dict[str, Path]) -> None:
    tokenizer = Tokenizer.from_file(str(checkpoint_dirs["tiny-qwen3"] / "tokenizer.json"))
    for token in SPECIAL_TOKENS + THINK_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False).ids) == 1, token
    # Byte-level: any text tokenizes, and decodes back to itself.
    text = "Ünïcödé, Привет, 你好, مرحبا, emoji 🎉\t\n<b>{\"json\": [1, 2]}</b>"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_the_chat_template_renders_thinking_on_and_off(checkpoint_dirs: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint_dirs["tiny-qwen3"]))
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello in French."}]

    def render(**kwargs: Any) -> str:
        return str(tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True, **kwargs))

    on = render()
    assert on.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert render(enable_thinking=True) == on
    # Qwen3's own rendering of thinking off: an empty trace.
    assert render(enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "Reasoning effort: low." in render(reasoning_effort="low")
    assert "Reasoning effort" not in render(enable_thinking=False, reasoning_effort="low")
    # An earlier answer's trace is not carried into the next turn.
    history = [*messages, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nSalut"},
               {"role": "user", "content": "Again."}]
    rendered = str(tokenizer.apply_chat_template(history, tokenize=False,
                                                 add_generation_prompt=True))
    assert "hm" not in rendered and "<|im_start|>assistant\nSalut<|im_end|>" in rendered


def test_the_training_conversations_teach_the_turns_the_engine_renders(
        checkpoint_dirs: dict[str, Path]) -> None:
    from inference import checkpoints, corpus

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint_dirs["tiny-qwen3"]))
    rng = random.Random(0)
    for conversation in (corpus.conversation_generate(rng) for _ in range(400)):
        ids, start = checkpoints._tokenized(conversation, tokenizer)
        prompt, learnt = str(tokenizer.decode(ids[:start])), str(tokenizer.decode(ids[start:]))
        # The prompt is the chat engine's own rendering; what is learnt is one assistant
        # turn, whole (nothing cut by the length limit), ending on the end token.
        assert prompt.startswith(str(tokenizer.apply_chat_template(
            conversation.messages, tokenize=False, add_generation_prompt=True,
            **conversation.kwargs)))
        assert learnt.endswith("<|im_end|>") and learnt.count("<|im_end|>") == 1
        assert "<think>" not in learnt and "<|im_start|>" not in learnt
        if not conversation.kwargs["enable_thinking"]:
            assert prompt.endswith("<think>\n\n</think>\n\n") and "</think>" not in learnt
        elif conversation.forced:  # a trace the budget closed: only the answer is learnt
            assert prompt.endswith(f"{BUDGET_NOTICE}\n</think>") and "</think>" not in learnt
        else:  # the model's own trace, closed once, then the answer
            assert prompt.endswith("<think>\n") and learnt.count("\n</think>\n\n") == 1
            reasoning, answer = learnt.split("\n</think>\n\n")
            assert reasoning.strip() and answer.removesuffix("<|im_end|>").strip()


def test_the_build_is_idempotent(checkpoint_dirs: dict[str, Path]) -> None:
    stamps = {name: (path / STAMP).stat().st_mtime_ns for name, path in checkpoint_dirs.items()}
    again = checkpoints_build(dest=checkpoint_dirs["tiny-qwen3"].parent)
    assert again == checkpoint_dirs
    assert {name: (path / STAMP).stat().st_mtime_ns for name, path in again.items()} == stamps


def test_a_stale_checkpoint_is_rebuilt(tmp_path: Path) -> None:
    from inference import checkpoints

    target = tmp_path / "minilm"
    target.mkdir()
    (target / STAMP).write_text(json.dumps({"name": "minilm", "recipe": 0}))
    checkpoints._built(target, "minilm", checkpoints.minilm_write)
    assert json.loads((target / STAMP).read_text())["recipe"] == checkpoints.RECIPE["minilm"]
    assert (target / "model.safetensors").is_file()
    assert (target / "1_Pooling" / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_the_command_prints_the_directories_as_json(checkpoint_dirs: dict[str, Path]) -> None:
    out = io.StringIO()
    call_command("build_checkpoints", "--dest", str(checkpoint_dirs["minilm"].parent),
                 stdout=out)
    printed = json.loads(out.getvalue())
    assert printed["directories"] == {name: str(path) for name, path in checkpoint_dirs.items()}
    assert printed["ANEX_CHECKPOINTS"] == anex_checkpoints_value(checkpoint_dirs)
    served = dict(item.split("=") for item in printed["ANEX_CHECKPOINTS"].split(";"))
    assert served == {"tiny-qwen3": str(checkpoint_dirs["tiny-qwen3"]),
                      "laya": str(checkpoint_dirs["tiny-qwen3"]),
                      "all-minilm-l6-v2": str(checkpoint_dirs["minilm"])}


def test_the_local_models_are_in_the_catalog_marked_local() -> None:
    assert set(local_models()) == {"tiny-qwen3", "all-minilm-l6-v2"}
    assert not set(local_models()) & set(catalog())  # the public list stays the reference's
    chat, embed = model_get("tiny-qwen3"), model_get("all-minilm-l6-v2")
    assert chat is not None and chat.local and isinstance(kind_for(chat), ChatKind)
    assert chat.reasoning
    assert chat.effort_levels == ("low", "medium", "xhigh")
    assert chat.price.input_per_mtok > 0 and chat.price.output_per_mtok > 0
    assert embed is not None and embed.local and isinstance(kind_for(embed), EmbedKind)
    assert (embed.dimensions_native, embed.dimensions_min) == (384, 32)


def test_the_estimator_counts_with_the_local_checkpoints(
        settings: Settings, checkpoint_dirs: dict[str, Path]) -> None:
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": checkpoint_dirs["tiny-qwen3"],
                                 "all-minilm-l6-v2": checkpoint_dirs["minilm"]}
    for model_id in settings.ANEX_CHECKPOINTS:
        count = token_counter(model_id)
        assert count is not None and count("Say hello in French.") > 0


def test_engine_for_builds_each_models_engine_once(
        settings: Settings, checkpoint_dirs: dict[str, Path], chat_engine: ChatEngine,
        decision_engine: DecisionEngine, embedding_engine: EmbeddingEngine) -> None:
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": checkpoint_dirs["tiny-qwen3"],
                                 "laya": checkpoint_dirs["tiny-qwen3"],
                                 "all-minilm-l6-v2": checkpoint_dirs["minilm"]}
    chat, laya, minilm = (engine_for("tiny-qwen3"), engine_for("laya"),
                          engine_for("all-minilm-l6-v2"))
    assert isinstance(chat, ChatEngine) and engine_for("tiny-qwen3") is chat
    assert isinstance(laya, DecisionEngine) and isinstance(minilm, EmbeddingEngine)
    # One vLLM engine per checkpoint in the process: laya's routes read tiny-qwen3's.
    assert chat.llm is chat_engine.llm
    assert laya.readers["english"].llm is laya.readers["multilingual"].llm is chat.llm
    assert minilm.llm is embedding_engine.llm
    assert llm_load(checkpoint_dirs["minilm"], runner="pooling", max_model_len=1).llm \
        is minilm.llm


def test_engine_for_an_unserved_model_says_how_to_serve_it(settings: Settings) -> None:
    settings.ANEX_CHECKPOINTS = {}
    with pytest.raises(EngineNotConfigured, match="ANEX_CHECKPOINTS"):
        engine_for("qwen3.8-27b")
    with pytest.raises(EngineNotConfigured, match="not in the catalog"):
        engine_for("no-such-model")
