"""The GPU check of media rows (issue 41 item 6), prepared for a device machine: one image,
one audio and one video row through the real engine code (each model's task kind builds
its engine as a worker does, and its rows are the kind's engine rows, the media decoded by
the worker's own decoders), on the local tiny checkpoints and on a tiny checkpoint of the
Qwen3-VL architecture, so the native image and video path of the reference's own VL family
runs there (on these CPU machines vLLM's Qwen3-VL module needs torchvision, which has no
CPU build here).

STATUS: UNRUN. No GPU machine was lent to the session that wrote it; nothing here has run
on a GPU yet (bench/RESULTS.md, "GPU media check"). The `build` step and the inventory
were run on the 2-core CPU machine.

Two steps:

    # here: build the media checkpoints (and the tiny Qwen3-VL) into a carry directory,
    # checking it stays under the device's 64 MiB
    .venv/bin/python bench/gpu_media.py build .run/gpu-media  # ANEX_RUN_DIR as build_checkpoints

    # on the device (the device tool, carry=[".run/gpu-media"]), with its own Python:
    python3 bench/gpu_media.py inventory              # what it has, as JSON; cheap
    python3 bench/gpu_media.py run .run/gpu-media     # inventory first, then the rows

`run --cpu` rehearses the script on a CPU machine (where the Qwen3-VL rows fail for want of
torchvision, as expected there).

The device reaches no registry, so `run` starts by reporting what is installed (Python,
torch and its CUDA, vLLM, transformers, torchvision, Django, Pillow, numpy, OpenCV, PyAV)
and stops, saying what is missing, rather than failing part way. It configures Django with
the few settings the engine code reads (no database, no broker). Each row prints one JSON
line: the model, the modality, the engine's answer (a completion's text or a vector's
width and norm), prompt_tokens and media_tokens, or the error; then a summary line. Exit
status 0 only when every row it could run was answered.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import math
import os
import platform
import shutil
import sys
import time
import uuid
import wave
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CARRY_LIMIT = 60 * 1024 * 1024  # under the device's 64 MiB, leaving the working tree room
QWEN3_VL = "tiny-qwen3-vl"
# What the check needs on the device, by import name; the rest is reported only.
NEEDED = ("torch", "vllm", "transformers", "django", "PIL", "numpy", "cv2", "av")
REPORTED = ("torchvision", "torchaudio", "tokenizers", "safetensors", "pyarrow")
RED, BLUE = (230, 20, 20), (20, 20, 230)


# -- inventory -----------------------------------------------------------------------------

def inventory() -> dict[str, Any]:
    """What this machine has: versions of every module the check reads (None: missing),
    and the GPUs torch sees."""
    found: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in NEEDED + REPORTED:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # a module that is there but fails to load counts too
            found[name] = None if isinstance(error, ModuleNotFoundError) \
                else f"fails to import: {type(error).__name__}: {error}"[:300]
            continue
        found[name] = str(getattr(module, "__version__", "present"))
    if isinstance(found.get("torch"), str) and not found["torch"].startswith("fails"):
        import torch

        found["cuda"] = torch.version.cuda
        found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return found


def missing(found: dict[str, Any], *, gpu: bool = True) -> list[str]:
    problems = [name for name in NEEDED
                if not isinstance(found.get(name), str) or found[name].startswith("fails")]
    if gpu and not found.get("gpus"):
        problems.append("a CUDA GPU that torch sees")
    return problems


# -- build (here) ------------------------------------------------------------------------

def build(dest: Path) -> dict[str, Any]:
    """The local checkpoints of the media models (as build_checkpoints builds them) and the
    tiny Qwen3-VL, copied under dest; their sizes, within CARRY_LIMIT."""
    django_setup(checkpoints={})
    from inference.catalog import local_models
    from inference.checkpoints import SERVED_BY, TINY_QWEN3, checkpoints_build
    from inference.checkpoints_qwen3_vl import tiny_qwen3_vl_write

    built = checkpoints_build()  # where build_checkpoints puts them: ANEX_RUN_DIR, else .run
    media = sorted({SERVED_BY[model.id] for model in local_models().values()
                    if model.media_modalities and model.id in SERVED_BY})
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in media:
        shutil.copytree(built[name], dest / name)
    started = time.monotonic()
    (dest / QWEN3_VL).mkdir()
    tiny_qwen3_vl_write(dest / QWEN3_VL, tokenizer_from=built[TINY_QWEN3])
    sizes = {path.name: directory_bytes(path) for path in sorted(dest.iterdir())}
    total = sum(sizes.values())
    report = {"dest": str(dest), "bytes": sizes, "total_bytes": total,
              "qwen3_vl_build_seconds": round(time.monotonic() - started, 1)}
    if total > CARRY_LIMIT:
        raise SystemExit(f"{total:,} bytes to carry, over {CARRY_LIMIT:,}: {report}")
    return report


def directory_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


# -- the rows (on the device) ----------------------------------------------------------------

def django_setup(*, checkpoints: dict[str, str]) -> None:
    """Django with what the engine code reads, and nothing it would connect to. Each engine
    takes a tenth of the GPU's memory (ANEX_GPU_MEMORY_FRACTION): the script holds up to
    five tiny engines at once in one process."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            BASE_DIR=ROOT, USE_TZ=True, ANEX_CHECKPOINTS=checkpoints,
            ANEX_GPU_MEMORY_FRACTION=float(os.environ.get("ANEX_GPU_MEMORY_FRACTION", "0.1")),
            ANEX_TENSOR_PARALLEL_SIZE=1)
        django.setup()


def picture(colour: tuple[int, int, int]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (96, 64), colour).save(out, "PNG")
    return out.getvalue()


def tone(frequency: float, seconds: float = 2.0, rate: int = 16_000) -> bytes:
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * frequency * t) * 0.5 * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(samples.tobytes())
    return out.getvalue()


def video(colours: list[tuple[int, int, int]], fps: int = 10) -> bytes:
    import tempfile

    import cv2
    import numpy as np

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "clip.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, (96, 64))
        for red, green, blue in colours:
            frame = np.zeros((64, 96, 3), np.uint8)
            frame[:] = (blue, green, red)
            writer.write(frame)
        writer.release()
        return path.read_bytes()


def media_parts(model: Any) -> dict[str, dict[str, Any]]:
    """One part per modality the model takes, decoded by the worker's decoders, as the
    worker hands a resolved part to an engine."""
    from inference.engines.media import DECODED_KEY
    from inference.kinds.media_decode import audio_decode, image_decode, video_decode

    parts: dict[str, dict[str, Any]] = {}
    if "image" in model.modalities:
        data = picture(RED)
        parts["image"] = {"type": "image_url", "image_url": {"url": "data:image/png;base64,"},
                          DECODED_KEY: image_decode(data)}
    if "audio" in model.modalities:
        data = tone(880.0)
        parts["audio"] = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"},
                          DECODED_KEY: audio_decode(data, rate=model.media.audio_sample_rate,
                                                    max_seconds=2.0)}
    if "video" in model.modalities:
        data = video([RED] * 10 + [BLUE] * 10)
        fps = float(model.media.video_fps_default or 1)
        parts["video"] = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,"},
                          DECODED_KEY: video_decode(data, fps=fps, max_seconds=2.0,
                                                    max_frames=8)}
    return parts


def served_job(model: Any) -> SimpleNamespace:
    return SimpleNamespace(pk=uuid.uuid4(), organization_id=uuid.uuid4(), model=model.id,
                           max_output_tokens=8, reasoning=False, reasoning_budget=None,
                           reasoning_effort="low", response_format=None, dimensions=None,
                           video_fps=None)


def rows_run(model: Any, checkpoint: Path) -> list[dict[str, Any]]:
    """The model's media rows through its kind's engine, built from the checkpoint as a
    worker builds it: one call, the rows in one chunk."""
    from inference.engines import ChatEngine, EmbeddingEngine
    from inference.engines.types import ChatSettings
    from inference.kinds import kind_for

    kind = kind_for(model)
    parts = media_parts(model)
    started = time.monotonic()
    engine = kind.engine_build(model, checkpoint)
    loaded = time.monotonic() - started
    job = served_job(model)
    bodies: list[dict[str, Any]] = []
    for part in parts.values():
        if model.task == "embed":
            bodies.append({"input": [{"type": "text", "text": "this:"}, part]})
        else:
            bodies.append({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in it?"}, part]}],
                "chat_template_kwargs": {"enable_thinking": False}})
    requests: list[Any] = [kind.engine_request(job, body) for body in bodies]
    started = time.monotonic()
    outcomes: list[Any]
    if isinstance(engine, EmbeddingEngine):
        outcomes = engine.embed(requests)
    elif isinstance(engine, ChatEngine):
        outcomes = engine.generate(requests, ChatSettings(max_tokens=8))
    else:
        raise TypeError(f"{model.id} is served by no chat or embedding engine")
    seconds = time.monotonic() - started
    lines = []
    outcome: Any  # a ChatOutcome or an EmbedOutcome
    for modality, outcome in zip(parts, outcomes, strict=True):
        line: dict[str, Any] = {"model": model.id, "checkpoint": checkpoint.name,
                                "modality": modality, "load_seconds": round(loaded, 1),
                                "run_seconds": round(seconds, 2),
                                "prompt_tokens": outcome.prompt_tokens,
                                "media_tokens": getattr(outcome, "media_tokens", None),
                                "error": None if outcome.error is None
                                else outcome.error.message}
        if model.task == "embed" and outcome.vector is not None:
            line["width"] = len(outcome.vector)
            line["norm"] = round(math.sqrt(math.fsum(x * x for x in outcome.vector)), 6)
        elif model.task != "embed":
            line["content"] = outcome.content
        lines.append(line)
    return lines


def models_for(carried: Path) -> list[tuple[Any, Path]]:
    """Each carried checkpoint with the catalog model it serves; the tiny Qwen3-VL as both
    of its family's kinds (the catalog's qwen3-vl-embedding-2b and qwen3.8-27b, cut to its
    size)."""
    from inference.catalog import local_models, model_get
    from inference.checkpoints import SERVED_BY

    pairs = [(model, carried / SERVED_BY[model.id]) for model in local_models().values()
             if model.media_modalities and (carried / SERVED_BY.get(model.id, "-")).is_dir()]
    if (carried / QWEN3_VL).is_dir():
        embedding, chat = model_get("qwen3-vl-embedding-2b"), model_get("qwen3.8-27b")
        assert embedding is not None and chat is not None
        pairs.append((replace(embedding, id=f"{QWEN3_VL}-embedding", context_tokens=4096,
                              dimensions_native=256, dimensions_min=32), carried / QWEN3_VL))
        pairs.append((replace(chat, id=QWEN3_VL, context_tokens=4096,
                              media_context_tokens=None, max_output_tokens=64,
                              reasoning=False), carried / QWEN3_VL))
    return pairs


def run(carried: Path, *, gpu: bool = True) -> int:
    found = inventory()
    print(json.dumps({"inventory": found}), flush=True)
    problems = missing(found, gpu=gpu)
    if problems:
        print(json.dumps({"stopped": f"missing on this machine: {', '.join(problems)}"}))
        return 2
    django_setup(checkpoints={})
    failed = answered = 0
    for model, checkpoint in models_for(carried):
        try:
            lines = rows_run(model, checkpoint)
        except Exception as error:  # one model's failure is reported; the next still runs
            lines = [{"model": model.id, "checkpoint": checkpoint.name,
                      "error": f"{type(error).__name__}: {error}"[:2000]}]
        for line in lines:
            print(json.dumps(line), flush=True)
            failed += line["error"] is not None
            answered += line["error"] is None
    print(json.dumps({"answered": answered, "failed": failed}))
    return 0 if answered and not failed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("inventory")
    steps.add_parser("build").add_argument("carried", type=Path)
    running = steps.add_parser("run")
    running.add_argument("carried", type=Path)
    running.add_argument("--cpu", action="store_true",
                         help="run without a GPU (a rehearsal of the script on a CPU machine)")
    arguments = parser.parse_args()
    if arguments.step == "inventory":
        found = inventory()
        print(json.dumps({"inventory": found, "missing": missing(found)}))
        return 0
    if arguments.step == "build":
        print(json.dumps(build(arguments.carried.resolve())))
        return 0
    return run(arguments.carried.resolve(), gpu=not arguments.cpu)


if __name__ == "__main__":  # vLLM spawns its engine core: the guard it needs
    sys.exit(main())
