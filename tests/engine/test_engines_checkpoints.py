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
                      "all-minilm-l6-v2": str(checkpoint_dirs["minilm"]),
                      "tiny-vl": str(checkpoint_dirs["tiny-vl"]),
                      "tiny-audio": str(checkpoint_dirs["tiny-audio"]),
                      "tiny-vl-embedding": str(checkpoint_dirs["tiny-vl-embedding"])}


def test_the_local_models_are_in_the_catalog_marked_local() -> None:
    assert set(local_models()) == {"tiny-qwen3", "all-minilm-l6-v2", "tiny-vl", "tiny-audio",
                                   "tiny-vl-embedding"}
    assert not set(local_models()) & set(catalog())  # the public list stays the reference's
    chat, embed = model_get("tiny-qwen3"), model_get("all-minilm-l6-v2")
    assert chat is not None and chat.local and isinstance(kind_for(chat), ChatKind)
    assert chat.reasoning
    assert chat.effort_levels == ("low", "medium", "xhigh")
    assert chat.price.input_per_mtok > 0 and chat.price.output_per_mtok > 0
    assert embed is not None and embed.local and isinstance(kind_for(embed), EmbedKind)
    assert (embed.dimensions_native, embed.dimensions_min) == (384, 32)


def test_tiny_vl_embedding_is_idefics3_on_tiny_qwen3s_tokenizer_plus_its_image_tokens(
        checkpoint_dirs: dict[str, Path]) -> None:
    from inference.checkpoints_embedding_media import IMAGE_PROMPT_TOKENS, IMAGE_TOKENS

    directory = checkpoint_dirs["tiny-vl-embedding"]
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "idefics3"
    vl = Tokenizer.from_file(str(directory / "tokenizer.json"))
    text = Tokenizer.from_file(str(checkpoint_dirs["tiny-qwen3"] / "tokenizer.json"))
    sample = "Say hello in French. <|im_start|>user\n"
    assert vl.encode(sample).ids == text.encode(sample).ids  # the same text tokens
    for token in IMAGE_TOKENS:
        assert len(vl.encode(token, add_special_tokens=False).ids) == 1, token
    assert config["text_config"]["vocab_size"] == vl.get_vocab_size()
    # What the catalog bills a picture is what the checkpoint reads of one.
    model = model_get("tiny-vl-embedding")
    assert model is not None and model.local and isinstance(kind_for(model), EmbedKind)
    assert model.media.image_tokens == model.media.video_frame_tokens == IMAGE_PROMPT_TOKENS
    assert model.dimensions_native == config["text_config"]["hidden_size"]
    assert model.price.realtime_input_per_mtok is not None  # served in realtime for text
    # Last-token pooling, as its sentence-transformers files declare to vLLM.
    pooling = json.loads((directory / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_lasttoken"] is True


def test_a_tiny_qwen3_vl_builds_here_within_the_devices_carry(
        tmp_path: Path, checkpoint_dirs: dict[str, Path]) -> None:
    # For the GPU check (bench/gpu_media.py): the model classes and the image processor
    # build without torchvision; the whole carry is 64 MiB.
    from transformers import AutoConfig

    from inference.checkpoints_qwen3_vl import VISION_TOKENS, tiny_qwen3_vl_write

    tiny_qwen3_vl_write(tmp_path, tokenizer_from=checkpoint_dirs["tiny-qwen3"])
    config = AutoConfig.from_pretrained(str(tmp_path))
    assert config.model_type == "qwen3_vl"
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in VISION_TOKENS}
    assert (config.image_token_id, config.video_token_id) == (
        ids["<|image_pad|>"], ids["<|video_pad|>"])
    for name in ("preprocessor_config.json", "video_preprocessor_config.json",
                 "model.safetensors"):
        assert (tmp_path / name).is_file(), name
    size = sum(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file())
    assert size < 16 * 1024 * 1024, size


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
