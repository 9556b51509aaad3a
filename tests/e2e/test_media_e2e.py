"""Issue 41's "Must show", through HTTP on `make run` (the session's one, tests/launch.py)
with the real local checkpoints: image, video and audio rows on the chat models, and
media rows on the VL embedding model, each job `done`, its media rows answered and billed
as the catalog says, a corrupt part and an unreachable URL failing their rows alone and
unbilled, and the charge the sum of the rows' costs within the hold.

The media are made here (tests/media.py) and sent inline as data: URIs; the unreachable
URL's name is in `.invalid`, which never resolves (RFC 6761). Needs the local models
`tiny-vl`, `tiny-audio` and `tiny-vl-embedding` in the catalog and `build_checkpoints`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
import requests

from inference.catalog import CatalogModel, model_get
from inference.rows.durations import clip_header_read
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.launch import ROOT, Running
from tests.media import clip, data_uri, noise_picture, picture, tone

pytestmark = pytest.mark.timeout(900)
RED, BLUE = (230, 20, 20), (20, 20, 230)
UNREACHABLE = "https://media.anex-tests.invalid/photo.png"
TEXT = "What is the main colour?"


def model(model_id: str) -> CatalogModel:
    found = model_get(model_id)
    assert found is not None, f"{model_id} is not in the catalog"
    return found


def chat_line(custom_id: str, *parts: dict[str, Any], text: str = TEXT) -> dict[str, Any]:
    content: Any = [{"type": "text", "text": text}, *parts] if parts else text
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": content}],
                     "chat_template_kwargs": {"enable_thinking": False}}}


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def corrupt_png() -> str:
    whole = noise_picture(5, size=(256, 192), fmt="PNG")
    return data_uri(whole[:len(whole) // 2], "image/png")


class Api:
    """The batch API of the running `make run`, as a customer's script calls it."""

    def __init__(self, running: Running) -> None:
        self.running = running
        self.base = running.base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {running.key}"

    def job_done(self, lines: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        rows = "".join(json.dumps(line) + "\n" for line in lines)
        target = self.session.post(f"{self.base}/inputs", json={"format": "jsonl"}).json()
        requests.post(target["upload_url"], data=target["fields"],
                      files={"file": ("rows.jsonl", rows)}, timeout=60).raise_for_status()
        job = self.session.post(f"{self.base}/jobs",
                                json={"input_id": target["id"], **fields}).json()
        assert "id" in job, job
        estimate = self.poll(job["id"], "submitted", "estimating")
        assert estimate["status"] == "cost_ready", estimate
        approved = self.session.post(f"{self.base}/jobs/{job['id']}/approve")
        assert approved.status_code == 200, approved.text
        done = self.poll(job["id"], "in_progress", "finalizing")
        assert done["status"] == "done", (done, self.running.log.read_text()[-4000:])
        return {**done, "cost_cents": self.charge_cents(job["id"])}

    def charge_cents(self, job_id: str) -> int:
        """The job's charge, which the batch API does not show: read from the running
        `make run`'s own database, through `devstack exec` on its run directory (as `make
        manage` reaches it)."""
        script = ("from jobs.models import Job; "
                  f"print('cost_cents', Job.objects.get(pk='{job_id}').cost_cents)")
        env = {**self.running.env, "ANEX_RUN_DIR": str(self.running.run_dir)}
        shell = subprocess.run(
            [sys.executable, "-m", "anex.devstack", "exec", "--", sys.executable, "manage.py",
             "shell", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=120, check=True)
        # The launcher says what it does on the same stdout: the one line printed here.
        [line] = [line for line in shell.stdout.splitlines() if line.startswith("cost_cents ")]
        return int(line.split()[1])

    def poll(self, job_id: str, *waiting: str) -> dict[str, Any]:
        deadline = time.monotonic() + 600
        while (state := self.session.get(f"{self.base}/jobs/{job_id}").json())["status"] \
                in waiting:
            assert time.monotonic() < deadline, state
            time.sleep(1)
        return state  # type: ignore[no-any-return]

    def result(self, job_id: str) -> dict[str, dict[str, Any]]:
        link = self.session.get(f"{self.base}/jobs/{job_id}/result").json()["result_url"]
        lines = requests.get(link, timeout=60).text.splitlines()
        return {row["custom_id"]: row for row in map(json.loads, lines)}


def charged_within_hold(job: dict[str, Any], rows: dict[str, dict[str, Any]],
                        failed: tuple[str, ...]) -> None:
    """The job's charge is the sum of its rows' costs, at most its hold; the failed rows
    cost nothing."""
    costs = {custom_id: Decimal(row["cost"]["credits"]) for custom_id, row in rows.items()}
    assert sum(costs.values()) == job["cost_cents"]
    assert 1 <= job["cost_cents"] <= job["est_cost_cents"]
    for custom_id in failed:
        assert costs[custom_id] == 0 and rows[custom_id]["response"]["body"] is None


def answered(row: dict[str, Any]) -> dict[str, Any]:
    assert row["error"] is None and row["response"]["status_code"] == 200, row
    body: dict[str, Any] = row["response"]["body"]
    return body


def video_frames(video: bytes, fps: Decimal) -> int:
    """The frames the estimate bills a clip: ceil(seconds x rate) + 1, at the clip's own
    rate where that is lower."""
    header = clip_header_read(video, "mp4")
    assert header is not None
    rate = min(fps, header.fps) if header.fps else fps
    return max(2, math.ceil(header.seconds * rate) + 1)


def test_a_chat_job_on_tiny_vl_reads_png_jpeg_and_video_rows(make_run: Running) -> None:
    api = Api(make_run)
    vl = model("tiny-vl")
    assert {"image", "video"} <= set(vl.modalities)
    video = clip([RED] * 10 + [BLUE] * 10, fps=10)
    lines = [
        chat_line("text"),
        chat_line("png-red", image_part(data_uri(picture(RED, fmt="PNG"), "image/png"))),
        chat_line("jpeg-blue", image_part(data_uri(picture(BLUE, fmt="JPEG"), "image/jpeg"))),
        chat_line("video", {"type": "video_url",
                            "video_url": {"url": data_uri(video, "video/mp4")}}),
        chat_line("corrupt", image_part(corrupt_png())),
        chat_line("unreachable", image_part(UNREACHABLE)),
    ]
    # reasoning false: the rows' thinking is off, and a job whose thinking may be on has
    # its output cap checked against a sampled thinking budget (jobs.services.sampling).
    job = api.job_done(lines, model="tiny-vl", max_output_tokens=8, reasoning=False)
    rows = api.result(job["id"])
    assert (job["success_rows"] + job["truncated_rows"], job["error_rows"]) == (4, 2)
    text_prompt = answered(rows["text"])["usage"]["prompt_tokens"]
    # each media row: a completion, its prompt the same text's plus the catalog's tokens
    for custom_id in ("png-red", "jpeg-blue"):
        body = answered(rows[custom_id])
        assert body["choices"][0]["message"]["content"] is not None
        assert body["usage"]["prompt_tokens"] - text_prompt == vl.media.image_tokens
    fps = Decimal(vl.media.video_fps_default or 1)
    assert answered(rows["video"])["usage"]["prompt_tokens"] - text_prompt \
        == video_frames(video, fps) * (vl.media.video_frame_tokens or 0)
    # two different images, two different answers
    assert answered(rows["png-red"])["choices"][0]["message"]["content"] \
        != answered(rows["jpeg-blue"])["choices"][0]["message"]["content"]
    # a corrupt image and an unreachable URL fail alone, unbilled
    assert rows["corrupt"]["error"]["type"] == "invalid_request_error"
    assert rows["corrupt"]["error"]["param"] == "messages[0].content[1]"
    assert rows["unreachable"]["error"]["type"] == "media_fetch_error"
    charged_within_hold(job, rows, ("corrupt", "unreachable"))


def test_a_chat_job_on_tiny_audio_hears_its_tones(make_run: Running) -> None:
    api = Api(make_run)
    audio = model("tiny-audio")
    assert "audio" in audio.modalities

    def tone_part(frequency: float) -> dict[str, Any]:
        wav = tone(frequency, seconds=2, rate=16_000)
        return {"type": "input_audio", "input_audio": {
            "data": data_uri(wav, "audio/wav").partition(",")[2], "format": "wav"}}

    lines = [
        chat_line("text", text="Is the tone high or low?"),
        chat_line("low", tone_part(220), text="Is the tone high or low?"),
        chat_line("high", tone_part(1_760), text="Is the tone high or low?"),
        chat_line("corrupt", {"type": "input_audio", "input_audio": {
            "data": data_uri(tone(440)[:22] + b"\x00\x00" + tone(440)[24:], "x")
            .partition(",")[2], "format": "wav"}}, text="Is the tone high or low?"),
        chat_line("unreachable", {"type": "audio_url", "audio_url": {
            "url": UNREACHABLE.replace(".png", ".wav"), "duration_seconds": 2}},
            text="Is the tone high or low?"),
    ]
    job = api.job_done(lines, model="tiny-audio", max_output_tokens=8, reasoning=False)
    rows = api.result(job["id"])
    text_prompt = answered(rows["text"])["usage"]["prompt_tokens"]
    per_second = audio.media.audio_tokens_per_second or Decimal(0)
    for custom_id in ("low", "high"):
        assert answered(rows[custom_id])["usage"]["prompt_tokens"] - text_prompt \
            == math.ceil(2 * per_second)
    assert answered(rows["low"])["choices"][0]["message"]["content"] \
        != answered(rows["high"])["choices"][0]["message"]["content"]
    assert rows["corrupt"]["error"]["type"] == "invalid_request_error"
    assert rows["unreachable"]["error"]["type"] == "media_fetch_error"
    charged_within_hold(job, rows, ("corrupt", "unreachable"))


def test_an_embedding_job_on_tiny_vl_embedding_shares_one_space_with_realtime_text(
        make_run: Running) -> None:
    api = Api(make_run)
    embedding = model("tiny-vl-embedding")
    assert {"image", "video"} <= set(embedding.modalities)

    def line(custom_id: str, value: Any) -> dict[str, Any]:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                "body": {"input": value}}

    text = "a red square"
    lines = [
        line("text", text),
        line("red", [image_part(data_uri(picture(RED), "image/png"))]),
        line("blue", [image_part(data_uri(picture(BLUE), "image/png"))]),
        line("video", [{"type": "video_url", "video_url": {
            "url": data_uri(clip([RED] * 20, fps=10), "video/mp4")}}]),
        line("corrupt", [image_part(corrupt_png())]),
        line("unreachable", [image_part(UNREACHABLE)]),
    ]
    job = api.job_done(lines, model="tiny-vl-embedding")
    rows = api.result(job["id"])
    vectors = {custom_id: np.array(answered(rows[custom_id])["data"][0]["embedding"])
               for custom_id in ("text", "red", "blue", "video")}
    for vector in vectors.values():  # unit vectors
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4
    assert float(vectors["red"] @ vectors["blue"]) < 0.9999  # two images, two vectors
    # a text row's vector is the realtime text query's on the same model and width
    realtime = requests.post(
        f"http://localhost:{make_run.port}/realtime/v1/embeddings", timeout=120,
        headers={"Authorization": f"Bearer {make_run.key}"},
        json={"model": "tiny-vl-embedding", "input": [text]})
    assert realtime.status_code == 200, realtime.text
    query = np.array(realtime.json()["data"][0]["embedding"])
    assert float(query @ vectors["text"]) >= 0.9999
    assert rows["corrupt"]["error"]["type"] == "invalid_request_error"
    assert rows["unreachable"]["error"]["type"] == "media_fetch_error"
    charged_within_hold(job, rows, ("corrupt", "unreachable"))
