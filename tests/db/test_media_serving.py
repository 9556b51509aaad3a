"""Issue 41, item 1 and 4: a chunk's media brought and decoded by the product before its
rows reach the engine, and billed as the estimate counts them.

The rows run through the real chunk path (jobs.services.running.execute, the kind's serve,
the SSRF-safe fetcher against local HTTPS servers) with only the engine faked: it records
what it was handed. Media are made here (tests/media.py)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from console.models import Organization
from inference.catalog import model_get
from inference.engines import ChatOutcome, ChatRow, ChatSettings, EmbedOutcome, EmbedRow
from inference.engines.media import DECODED_KEY, DecodedAudio, DecodedImage, DecodedVideo
from inference.kinds import media as kinds_media
from inference.kinds.base import InputRow
from inference.pricing import Usage, price, usage_from_json
from jobs.constants import JobStatus
from jobs.models import Chunk, Job
from jobs.services.estimation import job_estimate
from jobs.services.running import chunk_run, execute, job_finalize, job_start
from jobs.services.sampling import job_sample
from jobs.storage import storage_for
from tests.dispatched import dispatch_catch
from tests.factories import input_ready
from tests.media import clip, data_uri, dominant, noise_picture, picture, rgb, tone
from tests.servers import LocalServer, _Handler, free_port, reply, tls_context

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
RED, BLUE, GREEN = (255, 0, 0), (0, 0, 255), (0, 160, 0)
# gemma4-12b (catalog.toml): 256 tokens an image, 25 an audio second, 256 a video frame
# sampled at its fixed 1 fps.
IMAGE_TOKENS, AUDIO_PER_SECOND, FRAME_TOKENS = 256, 25, 256


@dataclass
class FakeChat:
    """Answers every row; keeps each call's rows. Its prompt counts its media as
    `media_tokens` a part (the processor's own count, unlike the catalog's)."""

    media_tokens: int | None = 7
    text_tokens: int = 20
    calls: list[list[ChatRow]] = field(default_factory=list)

    def generate(self, rows: list[ChatRow], settings: ChatSettings) -> list[ChatOutcome]:
        self.calls.append(rows)
        outcomes = []
        for row in rows:
            parts = decoded_parts(row.messages)
            media = None if self.media_tokens is None else self.media_tokens * len(parts)
            outcomes.append(ChatOutcome(
                content="ok", reasoning=None, finish_reason="stop",
                prompt_tokens=self.text_tokens + (media or 0), completion_tokens=3,
                reasoning_tokens=0, media_tokens=media))
        return outcomes


def decoded_parts(messages: list[dict[str, Any]]) -> list[Any]:
    return [part[DECODED_KEY] for message in messages
            if isinstance(message.get("content"), list)
            for part in message["content"] if DECODED_KEY in part]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeChat:
    fake = FakeChat()
    monkeypatch.setattr("inference.kinds.engines.engine_cached", lambda model_id, kind: fake)
    return fake


@pytest.fixture
def host(make_server: Callable[..., LocalServer], ca: Any, trust_ca: None,
         loopback: None) -> LocalServer:
    """An HTTPS media host on this machine, trusted and reachable by the fetcher."""
    return make_server(tls=tls_context(ca, "127.0.0.1"))


def serves(body: bytes) -> Callable[[_Handler], None]:
    return lambda handler: reply(handler, 200, body)


def chat_job(organization: Organization, model: str = "gemma4-12b", **fields: Any) -> Job:
    return Job.objects.create(organization=organization, model=model, task_type="chat",
                              status=JobStatus.IN_PROGRESS, max_output_tokens=8, **fields)


def row(index: int, *parts: dict[str, Any], text: str = "What colour is it?") -> InputRow:
    content = [{"type": "text", "text": text}, *parts]
    return InputRow(index, f"r{index}", {"messages": [{"role": "user", "content": content}]})


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def served(results: list[dict[str, Any]], index: int) -> dict[str, Any]:
    return next(item for item in results if item["i"] == index)


# -- decoded on the rows --------------------------------------------------------------------

def test_each_media_part_reaches_the_engine_decoded_and_never_as_its_url(
        organization: Organization, engine: FakeChat, host: LocalServer) -> None:
    # given a PNG and a JPEG inline, a hosted PNG, a WAV tone and an MP4 clip
    host.routes["/blue.png"] = serves(picture(BLUE))
    video = clip([RED] * 10 + [BLUE] * 10 + [GREEN] * 5, fps=10)  # 2.5 s at 10 fps
    rows = [
        row(0, image(data_uri(picture(RED), "image/png"))),
        row(1, image(data_uri(picture(GREEN, fmt="JPEG"), "image/jpeg"))),
        row(2, image(host.url("/blue.png"))),
        row(3, {"type": "input_audio", "input_audio": {
            "data": data_uri(tone(440, seconds=2, rate=44_100, channels=2), "x")
            .partition(",")[2], "format": "wav"}}),
        row(4, {"type": "video_url", "video_url": {"url": data_uri(video, "video/mp4")}}),
    ]
    # when the chunk runs
    results, _usage = execute(chat_job(organization), rows)
    # then every row was served, its media decoded: no URL or base64 reached the engine
    assert [item["outcome"] for item in results] == ["success"] * 5
    (handed,) = engine.calls
    decoded = [decoded_parts(request.messages) for request in handed]
    colours = [rgb(parts[0].image) for parts in decoded[:3]]
    assert all(isinstance(parts[0], DecodedImage) for parts in decoded[:3])
    assert [parts[0].image.size for parts in decoded[:3]] == [(64, 48)] * 3
    assert colours[0] == RED and colours[2] == BLUE
    assert abs(colours[1][1] - 160) <= 3 and max(colours[1][0], colours[1][2]) <= 3  # JPEG
    audio = decoded[3][0]
    assert isinstance(audio, DecodedAudio)
    # Mono float32 at the model's 16 kHz, the tone's 440 Hz still its loudest.
    assert (audio.rate, audio.samples.dtype, audio.samples.shape) == (16_000, np.float32,
                                                                      (32_000,))
    spectrum = np.abs(np.fft.rfft(audio.samples))
    assert abs(int(np.argmax(spectrum)) * 16_000 / len(audio.samples) - 440) < 2
    video_value = decoded[4][0]
    assert isinstance(video_value, DecodedVideo)
    # gemma4-12b samples at 1 fps: t = 0, 1, 2 and the clip's last frame (2.4 s), the
    # ceil(2.4 x 1) + 1 = 4 frames the estimate bills.
    assert (len(video_value.frames), video_value.fps) == (4, 1.0)
    assert [dominant(frame) for frame in video_value.frames] == [0, 2, 1, 1]
    for request in handed:
        for message in request.messages:
            for part in message["content"]:
                if DECODED_KEY in part:  # the customer's keys are kept beside it
                    assert part["type"] in ("image_url", "input_audio", "video_url")


def test_a_url_repeated_across_rows_is_fetched_once(
        organization: Organization, engine: FakeChat, host: LocalServer) -> None:
    host.routes["/same.png"] = serves(picture(RED))
    rows = [row(i, image(host.url("/same.png"))) for i in range(6)]
    results, _usage = execute(chat_job(organization), rows)
    assert [item["outcome"] for item in results] == ["success"] * 6
    assert [seen.path for seen in host.requests] == ["/same.png"]


def test_the_chunk_runs_in_windows_of_its_decoded_media_and_keeps_row_order(
        organization: Organization, engine: FakeChat, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a window that holds two 64 x 48 pictures' worth of pixels
    monkeypatch.setattr(kinds_media, "WINDOW_BYTES", 2 * 64 * 48 * 3)
    rows = [row(i, image(data_uri(picture((i * 40, 0, 0)), "image/png"))) for i in range(5)]
    results, _usage = execute(chat_job(organization), rows)
    # then the engine was called per window, and every row answered in its place
    assert [len(call) for call in engine.calls] == [2, 2, 1]
    reds = [rgb(decoded_parts(request.messages)[0].image)[0]
            for call in engine.calls for request in call]
    assert reds == [0, 40, 80, 120, 160]
    assert [item["id"] for item in results] == [f"r{i}" for i in range(5)]


# -- failures: the row alone ----------------------------------------------------------------

def test_a_part_that_cannot_be_fetched_or_decoded_fails_its_row_alone_unbilled(
        organization: Organization, engine: FakeChat, host: LocalServer) -> None:
    # given a good row, a corrupt image, a 404, an unreachable host, and a good row
    host.routes["/gone.png"] = lambda handler: reply(handler, 404, b"no")
    whole = noise_picture(1, size=(256, 192), fmt="PNG")
    corrupt = data_uri(whole[:len(whole) // 2], "image/png")  # cut off mid-way
    closed = f"https://127.0.0.1:{free_port()}/photo.png"
    rows = [row(0, image(data_uri(picture(RED), "image/png"))),
            row(1, image(corrupt)),
            row(2, image(host.url("/gone.png"))),
            row(3, image(closed)),
            row(4, image(data_uri(picture(BLUE), "image/png")))]
    results, usage = execute(chat_job(organization), rows)
    # then the three bad rows failed, each naming its part, and only the good rows ran
    assert [item["outcome"] for item in results] == ["success", "error", "error", "error",
                                                     "success"]
    assert [len(call) for call in engine.calls] == [2]
    errors = {item["i"]: item["error"] for item in results if item["error"]}
    assert errors[1]["type"] == "invalid_request_error"
    assert errors[1]["param"] == "messages[0].content[1]"
    assert errors[1]["message"].startswith("messages[0].content[1]: the image could not be "
                                           "decoded: the image is damaged or truncated")
    assert (errors[2]["type"], errors[2]["code"], errors[2]["param"]) == (
        "media_fetch_error", "404", "messages[0].content[1]")
    assert errors[2]["message"] == (f"messages[0].content[1]: the image at "
                                    f"https://127.0.0.1:{host.port}/… could not be downloaded: "
                                    "the host answered HTTP 404")
    assert (errors[3]["type"], errors[3]["code"]) == ("media_fetch_error", None)
    assert "did not reply" in errors[3]["message"]
    assert {served(results, i)["status_code"] for i in (1, 2, 3)} == {400}
    # and nothing is billed for them: the job's usage is the two good rows'
    for index in (1, 2, 3):
        assert usage_from_json(served(results, index)["usage"]) == Usage()
    assert usage == usage_from_json(served(results, 0)["usage"]) \
        + usage_from_json(served(results, 4)["usage"])
    assert usage.images == 2


def test_a_row_whose_image_url_points_at_a_private_address_is_refused_by_the_fetcher(
        organization: Organization, engine: FakeChat, monkeypatch: pytest.MonkeyPatch) -> None:
    # given the fetcher's connections watched
    connected: list[Any] = []
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        connected.append(address)
        real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    # when rows point at the cloud metadata address, a private network and loopback (tests
    # allow loopback only through the `loopback` fixture, not taken here)
    rows = [row(0, image("https://169.254.169.254/latest/meta-data/x.png")),
            row(1, image("https://10.0.0.7/internal.png")),
            row(2, image("https://127.0.0.1/admin.png")),
            row(3, image(data_uri(picture(RED), "image/png")))]
    results, _usage = execute(chat_job(organization), rows)
    # then each is refused before any connection, its row failed alone
    assert [item["outcome"] for item in results] == ["error", "error", "error", "success"]
    for index, host_name in enumerate(("169.254.169.254", "10.0.0.7", "127.0.0.1")):
        error = served(results, index)["error"]
        assert error["type"] == "media_fetch_error"
        assert error["message"].endswith(f"was not downloaded: {host_name} is not a public "
                                         "internet address")
    assert connected == []


def test_a_transient_answer_is_retried_and_a_host_that_never_replies_is_not_asked_again(
        organization: Organization, engine: FakeChat, host: LocalServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kinds_media, "FETCH_RETRY_SECONDS", (0.01, 0.01))
    answers = iter([503, 429])
    host.routes["/busy.png"] = lambda handler: reply(handler, next(answers, 200),
                                                     picture(GREEN))
    host.routes["/down.png"] = lambda handler: reply(handler, 503, b"down")
    closed = free_port()
    rows = [row(0, image(host.url("/busy.png"))), row(1, image(host.url("/down.png"))),
            *(row(i, image(f"https://127.0.0.1:{closed}/{i}.png")) for i in range(2, 6))]
    attempts: list[str] = []
    real_fetch = kinds_media.fetch

    def fetch(method: Any, url: str, **options: Any) -> Any:
        attempts.append(url)
        return real_fetch(method, url, **options)

    monkeypatch.setattr(kinds_media, "fetch", fetch)
    results, _usage = execute(chat_job(organization), rows)
    # the throttled image came on its third try; the one that stays down failed after three
    assert served(results, 0)["outcome"] == "success"
    assert served(results, 1)["error"]["code"] == "503"
    assert [seen.path for seen in host.requests].count("/busy.png") == 3
    assert [seen.path for seen in host.requests].count("/down.png") == 3
    # the silent host was tried three times for the first part that met it, then no more
    silent = [url for url in attempts if f":{closed}/" in url]
    assert len(silent) <= 3 + kinds_media.FETCHES_PER_CHUNK * 3
    assert all(served(results, i)["error"]["type"] == "media_fetch_error" for i in range(2, 6))


def test_the_surplus_past_four_images_is_refused_at_serving_time(
        organization: Organization, engine: FakeChat) -> None:
    five = [image(data_uri(picture(RED), "image/png")) for _ in range(5)]
    results, _usage = execute(chat_job(organization), [row(0, *five), row(1, *five[:4])])
    error = served(results, 0)["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error",
                                               "messages[0].content[5]")
    assert error["message"] == ("messages[0].content[5]: a row takes at most 4 images; this "
                                "is its 5th. Send the others in rows of their own.")
    assert served(results, 1)["outcome"] == "success"
    assert len(engine.calls[0]) == 1


# -- billing --------------------------------------------------------------------------------

def test_a_served_media_row_bills_the_catalogs_media_tokens_and_says_so_in_its_usage(
        organization: Organization, engine: FakeChat) -> None:
    # given the engine's processor making 7 tokens of an image, the catalog 256
    rows = [row(0, image(data_uri(picture(RED), "image/png")),
                image(data_uri(picture(BLUE), "image/png"))),
            InputRow(1, "text", {"messages": [{"role": "user", "content": "What colour?"}]})]
    results, usage = execute(chat_job(organization), rows)
    media_row, text_row = served(results, 0), served(results, 1)
    # then the media row bills its text as the engine read it (20 tokens) and its two
    # images at the catalog's 256 each, and its result's usage says those same tokens
    assert usage_from_json(media_row["usage"]) == Usage(
        input_tokens=20, media_tokens=2 * IMAGE_TOKENS, output_tokens=3, images=2)
    assert media_row["body"]["usage"]["prompt_tokens"] == 20 + 2 * IMAGE_TOKENS
    # a text row is as it was: the engine's own count
    assert text_row["body"]["usage"]["prompt_tokens"] == 20
    # the same text without media: the media row's prompt is the catalog's media more
    assert media_row["body"]["usage"]["prompt_tokens"] \
        - text_row["body"]["usage"]["prompt_tokens"] == 2 * IMAGE_TOKENS
    assert usage == usage_from_json(media_row["usage"]) + usage_from_json(text_row["usage"])


def test_an_engine_that_does_not_tell_its_media_tokens_apart_is_billed_the_catalogs(
        organization: Organization, engine: FakeChat) -> None:
    engine.media_tokens, engine.text_tokens = None, 300
    results, _usage = execute(chat_job(organization),
                              [row(0, image(data_uri(picture(RED), "image/png")))])
    assert usage_from_json(served(results, 0)["usage"]) == Usage(
        input_tokens=300 - IMAGE_TOKENS, media_tokens=IMAGE_TOKENS, output_tokens=3, images=1)
    assert served(results, 0)["body"]["usage"]["prompt_tokens"] == 300


@dataclass
class FakeEmbed:
    calls: list[list[EmbedRow]] = field(default_factory=list)

    def embed(self, rows: list[EmbedRow]) -> list[EmbedOutcome]:
        self.calls.append(rows)
        return [EmbedOutcome(vector=[1.0, 0.0], prompt_tokens=40 + 5 * len(
            [p for p in row.text if isinstance(p, dict) and DECODED_KEY in p])
            if isinstance(row.text, list) else 40,
            media_tokens=5 * len([p for p in row.text if isinstance(p, dict)
                                  and DECODED_KEY in p]) if isinstance(row.text, list)
            else None) for row in rows]


def test_an_embedding_row_embeds_its_decoded_media_billed_at_the_catalogs_tokens(
        organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEmbed()
    monkeypatch.setattr("inference.kinds.engines.engine_cached", lambda model_id, kind: fake)
    job = Job.objects.create(organization=organization, model="qwen3-vl-embedding-8b",
                             task_type="embed", status=JobStatus.IN_PROGRESS)
    video = clip([RED] * 30, fps=10)  # 3 s: at the embedding models' 1 fps, 4 frames
    rows = [InputRow(0, "text", {"input": "plain"}),
            InputRow(1, "media", {"input": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": data_uri(picture(RED), "image/png")}},
                {"type": "video_url", "video_url": {"url": data_uri(video, "video/mp4")}}]})]
    results, usage = execute(job, rows)
    (handed,) = fake.calls
    parts = handed[1].text
    assert isinstance(parts, list)
    values = [part[DECODED_KEY] for part in parts if DECODED_KEY in part]
    assert isinstance(values[0], DecodedImage) and isinstance(values[1], DecodedVideo)
    assert len(values[1].frames) == 4
    # qwen3-vl-embedding-8b: 1,280 tokens an image, 256 a frame; the text as the engine
    # read it (40), all at the media-row rate, plus the per-item charges' counts
    media_tokens = 1280 + 4 * 256
    assert usage == Usage(input_tokens=40, media_row_tokens=40 + media_tokens, images=1,
                          clips=1, media_seconds=Decimal("3"))
    assert served(results, 1)["body"]["usage"]["prompt_tokens"] == 40 + media_tokens


# -- the job: its charge is its rows' costs, within the hold ---------------------------------

def test_a_media_job_is_charged_the_sum_of_its_rows_costs_within_its_hold(
        api: APIClient, organization: Organization, settings: Settings, checkpoints: Any,
        engine: FakeChat, host: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_CHUNK_ROWS = 3
    host.routes["/red.png"] = serves(picture(RED))
    good = [image(data_uri(picture(RED), "image/png")), image(host.url("/red.png")),
            {"type": "input_audio", "input_audio": {
                "data": data_uri(tone(220, seconds=2), "x").partition(",")[2], "format": "wav"}},
            {"type": "video_url", "video_url": {
                "url": data_uri(clip([BLUE] * 20, fps=10), "video/mp4")}}]
    bad = [image(data_uri(b"GIF89a" + b"\x00" * 64, "image/gif")),
           image(f"https://127.0.0.1:{free_port()}/gone.png")]
    lines = b"".join(json.dumps({
        "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Name its colour."}, part]}]}}).encode() + b"\n"
        for i, part in enumerate(good + bad))
    item = input_ready(organization, lines)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b",
                               "max_output_tokens": 8}, format="json")
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "chunk_run_task")
    dispatch_catch(monkeypatch, lambda message: None, "job_finalize_task")
    job_start(job_id=job.pk)
    for chunk_id in sent:
        chunk_run(chunk_id=chunk_id)
    # the last chunk's settle sends the finalize to the CPU queue (tests/db/test_finalize.py);
    # here it runs as that actor would
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    job.refresh_from_db()
    assert (job.status, job.success_rows, job.error_rows) == (JobStatus.DONE, 4, 2)
    # then the charge is what the rows consumed, priced once, never over the hold
    model = model_get("gemma4-12b")
    assert model is not None
    usage = Usage()
    for chunk in Chunk.objects.filter(job=job):
        usage = usage + usage_from_json(chunk.usage)
    assert job.cost_cents == price(model, usage).cents
    assert job.cost_cents is not None and job.est_cost_cents is not None
    assert 1 <= job.cost_cents <= job.est_cost_cents
    # the media are in it: 2 images, 2 clips (2 s of audio, 2 s of video)
    assert (usage.images, usage.clips, usage.media_seconds) == (2, 2, Decimal("4"))
    assert usage.media_tokens == 2 * IMAGE_TOKENS + 2 * AUDIO_PER_SECOND + 3 * FRAME_TOKENS
    # and the result's rows' costs add up to the charge; the failed rows cost nothing
    path = storage_for("world").path(job.result_key)  # type: ignore[attr-defined]
    result = [json.loads(line) for line in path.read_text().splitlines()]
    costs = {line["custom_id"]: Decimal(line["cost"]["credits"]) for line in result}
    assert sum(costs.values()) == job.cost_cents
    assert costs["row-4"] == costs["row-5"] == 0
    assert result[4]["error"]["type"] == "invalid_request_error"
    assert result[5]["error"]["type"] == "media_fetch_error"
    ledger = LedgerEntry.objects.filter(job=job)
    assert -sum(entry.balance_delta for entry in ledger) == job.cost_cents


def test_the_output_length_sample_reads_the_rows_media_decoded(
        api: APIClient, organization: Organization, settings: Settings, checkpoints: Any,
        engine: FakeChat, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a job with no output cap, so its rows are sampled, one of them undecodable
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    whole = noise_picture(2, size=(128, 96), fmt="PNG")
    parts = [image(data_uri(picture(RED), "image/png")),
             image(data_uri(picture(BLUE), "image/png")),
             image(data_uri(whole[:len(whole) // 2], "image/png"))]
    lines = b"".join(json.dumps({
        "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Name its colour."}, part]}]}}).encode() + b"\n"
        for i, part in enumerate(parts))
    item = input_ready(organization, lines)
    dispatch_catch(monkeypatch, lambda message: None, "job_sample_task")
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b"}, format="json")
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
    # when the sample runs
    assert job_sample(job_id=job.pk) == JobStatus.COST_READY
    # then the engine read the sampled rows' pictures decoded, and not the broken one
    (sampled,) = engine.calls
    colours = sorted(rgb(decoded_parts(request.messages)[0].image) for request in sampled)
    assert colours == sorted([RED, BLUE])
