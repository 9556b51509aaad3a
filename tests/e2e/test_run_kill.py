"""A worker killed mid-job: its chunks are recovered by the heartbeat reaper, another worker
finishes them, and every row is delivered exactly once with one charge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings as django_settings
from django.db import connection
from pytest_django import Settings

from billing.models import LedgerEntry
from billing.services import credits_summary
from inference.checkpoints import anex_checkpoints_value
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.results import result_key
from jobs.services.lifecycle import job_approve
from jobs.services.recovery import recover
from jobs.storage import storage_for
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import SYSTEM, input_ready, organization_make

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
ROWS = 6


def database_url() -> str:
    db = connection.settings_dict
    host = db["HOST"]
    if host.startswith("/"):
        return f"postgresql://{quote(db['USER'])}@/{db['NAME']}?host={quote(host)}"
    return (f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'] or '')}@{host}:"
            f"{db['PORT'] or 5432}/{db['NAME']}")


def start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "dramatiq", "anex.worker", "--processes",
                             "1", "--threads", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def wait(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        time.sleep(0.3)
    assert done(), "timed out"


@pytest.mark.timeout(600)
def test_a_killed_worker_loses_no_row_and_charges_once(
        settings: Settings, checkpoint_dirs: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    served = {"tiny-qwen3": checkpoint_dirs["tiny-qwen3"]}
    settings.ANEX_CHECKPOINTS = served
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_HEARTBEAT_STALE_SECONDS = 6
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    organization = organization_make()
    lines = b"".join(json.dumps({"custom_id": f"row-{i}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": {
                                     "messages": [{"role": "user", "content": f"go {i}"}],
                                     "chat_template_kwargs": {"enable_thinking": False}}}
                                ).encode() + b"\n" for i in range(ROWS))
    item = input_ready(organization, lines)
    job = Job.objects.create(organization=organization, input=item, model="tiny-qwen3",
                             status=JobStatus.COST_READY, est_cost_cents=900, row_count=ROWS,
                             max_output_tokens=384, reasoning=False)
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": django_settings.REDIS_URL,
           "ANEX_CHECKPOINTS": anex_checkpoints_value(checkpoint_dirs),
           "ANEX_WORKER_MODELS": "tiny-qwen3", "ANEX_CHUNK_ROWS": "1",
           "ANEX_HEARTBEAT_STALE_SECONDS": "6", "ANEX_STORAGE_BACKEND": "local",
           "ANEX_STORAGE_ROOT": str(settings.ANEX_STORAGE_ROOT)}
    import dramatiq

    dramatiq.get_broker().flush_all()
    first = start_worker(env)
    try:
        job_approve(job=job, actor=SYSTEM)  # sends job_start_task after commit
        wait(lambda: Chunk.objects.filter(job=job, status=ChunkStatus.DONE).exists(), 300)
        # Kill it mid-job, as a machine dies: no goodbye, messages unacknowledged.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    done_before = Chunk.objects.filter(job=job, status=ChunkStatus.DONE).count()
    assert done_before < ROWS, "the worker finished before it could be killed"
    second = start_worker(env)
    try:
        def recovered() -> bool:
            recover()  # the periodic recovery pass, run here on a short period
            return Job.objects.get(pk=job.pk).status in (JobStatus.DONE, JobStatus.FAILED)

        wait(recovered, 400)
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(timeout=30)
    job.refresh_from_db()
    assert job.status == JobStatus.DONE, job.failure_reason
    assert (job.success_rows or 0) + (job.truncated_rows or 0) == ROWS
    with storage_for("world").open(result_key(job)) as handle:
        ids = [json.loads(line)["custom_id"] for line in handle]
    assert ids == [f"row-{i}" for i in range(ROWS)]  # every row, exactly once, in order
    kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds in (["charge", "hold", "release"], ["charge", "hold"])
    assert credits_summary(organization=organization).held == 0
