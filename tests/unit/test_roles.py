"""The deployment's roles (anex/roles.py): each worker role's queues and processes come from
its settings, a GPU worker is one process on its models' queues in the regions it names, a
bare multi-process `dramatiq anex.worker` is refused, the engine takes the deployment's GPU
settings, and the container files run only the roles. The roles started as processes
against the real services: tests/e2e/test_roles.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dramatiq
import pytest
import yaml
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules
from pytest_django import Settings

from anex import roles
from inference.engines import runtime
from inference.engines.runtime import CPU_GPU_MEMORY_UTILIZATION, engine_options
from jobs.dispatch import RUN, SAMPLE

ROOT = Path(__file__).resolve().parents[2]
# A production-grade key: DEBUG is off, so settings want check --deploy's 50 characters.
SECRET_KEY = "a-test-key-of-sixty-characters-0123456789-abcdefghijklmnopqrs"
QWEN, MINILM = "tiny-qwen3", "all-minilm-l6-v2"


@pytest.fixture
def served(settings: Settings, tmp_path: Path) -> None:
    settings.ANEX_CHECKPOINTS = {QWEN: tmp_path, MINILM: tmp_path}
    settings.ANEX_WORKER_MODELS = [QWEN, MINILM]
    settings.ANEX_WORKER_REGIONS = ["world"]
    settings.ANEX_GPU_WORKER_THREADS = 3


def test_a_gpu_worker_is_one_process_on_its_models_run_and_sample_queues(
        served: None, settings: Settings) -> None:
    # Each model's run queue, its flex chunks' queue (urgency tiers), its sample queue.
    worker = roles.gpu_worker()
    assert worker.queues == (f"run.world.{QWEN}", f"run.world.{QWEN}.flex",
                             f"sample.world.{QWEN}", f"run.world.{MINILM}",
                             f"run.world.{MINILM}.flex", f"sample.world.{MINILM}")
    assert (worker.processes, worker.threads) == (1, 3)
    settings.ANEX_WORKER_REGIONS = ["world", "eu"]
    settings.ANEX_WORKER_MODELS = [MINILM]
    worker = roles.gpu_worker()
    assert worker.queues == (f"run.world.{MINILM}", f"run.world.{MINILM}.flex",
                             f"sample.world.{MINILM}", f"run.eu.{MINILM}",
                             f"run.eu.{MINILM}.flex", f"sample.eu.{MINILM}")
    command = roles.command(roles.WORKER_GPU)
    assert command[command.index("--processes") + 1] == "1"
    assert command[command.index("--queues") + 1:] == list(worker.queues)


def test_a_gpu_worker_refuses_a_model_it_has_no_checkpoint_for(
        served: None, settings: Settings) -> None:
    settings.ANEX_WORKER_MODELS = [QWEN, "gemma4-12b"]
    with pytest.raises(ImproperlyConfigured, match="names gemma4-12b, with no checkpoint"):
        roles.gpu_worker()
    settings.ANEX_WORKER_MODELS = []
    with pytest.raises(ImproperlyConfigured, match="serves no model"):
        roles.gpu_worker()


def test_a_cpu_worker_takes_every_queue_but_the_models_and_its_processes_are_set(
        served: None, settings: Settings) -> None:
    autodiscover_modules("tasks")
    declared = {actor.queue_name for actor in
                map(dramatiq.get_broker().get_actor, dramatiq.get_broker().get_declared_actors())}
    cpu = set(roles.cpu_queues())
    # Every actor's queue is a CPU worker's, but the per-model ones' defaults (their
    # messages go to run.<region>.<model> and sample.<region>.<model>).
    assert declared - {RUN, SAMPLE} == cpu
    assert not cpu & set(roles.gpu_worker().queues)
    assert roles.cpu_worker().processes == 1
    settings.ANEX_CPU_WORKER_PROCESSES, settings.ANEX_CPU_WORKER_THREADS = 3, 5
    command = roles.command(roles.WORKER_CPU)
    assert command[command.index("--processes") + 1:][:3] == ["3", "--threads", "5"]
    assert sorted(command[command.index("--queues") + 1:]) == sorted(cpu)


@pytest.mark.parametrize("argv,refused", [
    (["/venv/bin/dramatiq", "anex.worker", "--processes", "4"], True),
    (["/venv/lib/dramatiq/__main__.py", "anex.worker", "-p", "2", "-Q", "run.world.x"], True),
    (["/venv/bin/dramatiq", "anex.worker", "--processes", "1"], False),
    (["/venv/bin/dramatiq", "anex.worker", "-p", "4", "--queues", "estimate", "jobs"], False),
    (["/venv/lib/pytest/__main__.py", "tests/unit"], False),
])
def test_a_bare_multi_process_worker_taking_model_queues_is_refused(
        argv: list[str], refused: bool) -> None:
    if refused:
        with pytest.raises(ImproperlyConfigured, match="would build an engine in each"):
            roles.engine_processes_refuse(argv)
    else:
        roles.engine_processes_refuse(argv)


def test_the_engine_takes_the_deployments_gpu_share_and_tensor_parallel_size(
        settings: Settings, tmp_path: Path) -> None:
    settings.ANEX_GPU_MEMORY_FRACTION = 0.42
    settings.ANEX_TENSOR_PARALLEL_SIZE = 4
    on_gpu = engine_options(tmp_path, runner="generate", max_model_len=512, cpu=False)
    assert on_gpu["gpu_memory_utilization"] == 0.42
    assert on_gpu["tensor_parallel_size"] == 4
    # The CPU build sizes its KV cache apart and has one "device".
    on_cpu = engine_options(tmp_path, runner="pooling", max_model_len=512, cpu=True)
    assert on_cpu["gpu_memory_utilization"] == CPU_GPU_MEMORY_UTILIZATION
    assert "tensor_parallel_size" not in on_cpu


def test_a_kv_budget_caps_a_chat_engines_cache_in_whole_blocks(
        settings: Settings, tmp_path: Path) -> None:
    # unset: vLLM sizes the cache from the memory it is given, as before
    assert "num_gpu_blocks_override" not in engine_options(
        tmp_path, runner="generate", max_model_len=512, cpu=True)
    settings.ANEX_KV_CACHE_TOKENS = 1000
    on_cpu = engine_options(tmp_path, runner="generate", max_model_len=512, cpu=True)
    assert on_cpu["num_gpu_blocks_override"] == 8  # 128-token blocks, rounded up
    on_gpu = engine_options(tmp_path, runner="generate", max_model_len=512, cpu=False)
    assert on_gpu["num_gpu_blocks_override"] == 63  # 16-token blocks
    # an encoder keeps no KV cache
    assert "num_gpu_blocks_override" not in engine_options(
        tmp_path, runner="pooling", max_model_len=512, cpu=True)


@pytest.mark.parametrize("flags,dtype", [
    ("fpu avx2 avx512f avx512_bf16", "float32"),  # no float16 arithmetic: the checkpoint's own
    ("fpu avx2 avx512f avx512_fp16", None),       # float16 computed: vLLM's choice stands
    ("fp asimd asimdhp", None),                   # Arm's half-precision arithmetic
])
def test_a_pooling_engine_on_a_cpu_without_float16_arithmetic_runs_in_float32(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: str, dtype: str | None) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    label = "Features" if "asimd" in flags else "flags"
    cpuinfo.write_text(f"processor\t: 0\n{label}\t\t: {flags}\n\n")
    monkeypatch.setattr(runtime, "CPUINFO", cpuinfo)
    pooling = engine_options(tmp_path, runner="pooling", max_model_len=512, cpu=True)
    assert pooling.get("dtype") == dtype
    # generation keeps vLLM's own choice, and so does every GPU
    assert "dtype" not in engine_options(tmp_path, runner="generate", max_model_len=512,
                                         cpu=True)
    assert "dtype" not in engine_options(tmp_path, runner="pooling", max_model_len=512,
                                         cpu=False)


def test_a_machine_without_cpuinfo_has_no_flags(tmp_path: Path) -> None:
    assert runtime.cpu_flags(tmp_path / "absent") == frozenset()


def test_the_web_role_is_gunicorn_on_its_address(settings: Settings) -> None:
    settings.ANEX_WEB_BIND, settings.ANEX_WEB_WORKERS = "0.0.0.0:9000", 3
    command = roles.command(roles.WEB)
    assert command[1:4] == ["-m", "gunicorn", "anex.wsgi:application"]
    assert command[command.index("--bind") + 1] == "0.0.0.0:9000"
    assert command[command.index("--workers") + 1] == "3"
    assert command[command.index("--config") + 1] == "python:anex.gunicorn_hooks"
    with pytest.raises(ValueError, match="unknown role 'scheduler'"):
        roles.command("scheduler")


HEAP_PROBE = """
import gc, json, django
django.setup()
from anex.gunicorn_hooks import post_worker_init
from inference.tokens import checkpoint_tokens
post_worker_init(None)
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                  "tokenizers": checkpoint_tokens.cache_info().currsize}))
"""


def test_a_web_worker_freezes_its_heap_with_its_tokenizers_loaded(tokenizer_dir: Path,
                                                                  tmp_path: Path) -> None:
    # given a web worker's settings, one checkpoint with a tokenizer and one without
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "anex.settings",
                   "SECRET_KEY": SECRET_KEY,
                   "ANEX_CHECKPOINTS": f"a={tokenizer_dir};b={tmp_path}"}
    # when gunicorn calls the hook once the worker has loaded the application
    done = subprocess.run([sys.executable, "-c", HEAP_PROBE], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    heap = json.loads(done.stdout.splitlines()[-1])
    # then what lives as long as the process is out of the collector's reach, the
    # checkpoint's tokenizer among it
    assert heap["frozen"] > 100_000
    assert heap["tracked"] < heap["frozen"] / 20
    assert heap["tokenizers"] == 2


def test_the_container_files_run_only_the_roles() -> None:
    # Every service built from the image runs `python -m anex.roles ROLE`: the same command
    # make run starts (anex/devstack.py) and the e2e tests start (tests/e2e/test_roles.py).
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    image_services = {name: service for name, service in compose["services"].items()
                      if "build" in service or str(service.get("image", "")).startswith("anex")}
    ran = set()
    for name, service in image_services.items():
        command = service["command"]
        assert command[:3] == ["python", "-m", "anex.roles"], (name, command)
        assert command[3] in roles.ROLES, (name, command)
        # Only the realtime role takes arguments (its model and address).
        assert len(command) == 4 or command[3] == roles.REALTIME, (name, command)
        ran.add(command[3])
    assert ran == set(roles.ROLES)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'CMD ["python", "-m", "anex.roles", "web"]' in dockerfile
    gpu = yaml.safe_load((ROOT / "compose.gpu.yaml").read_text())
    reserved = [name for name, service in gpu["services"].items()
                if service.get("deploy", {}).get("resources", {}).get("reservations", {})
                .get("devices")]
    assert reserved == ["worker-gpu"]
