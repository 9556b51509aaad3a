"""The console in a real browser (Debian's chromium, driven by Playwright) against the real
product: a live server, the real broker and a Dramatiq worker, and the real MiniLM engine.

One walk through what a person does: sign up, verify the address from the mail, create a
key, upload a JSONL file in the browser, submit, watch the estimate arrive, approve, watch
the progress bar move to done, download the result, delete the job's data, set the webhook
endpoint, rotate its secret, send a test event, toggle auto-approve, invite a member, and
see that the member cannot open Settings. Then a screenshot of every page at desktop and
phone widths, under $ANEX_RUN_DIR/screenshots (git-ignored)."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import standardwebhooks
from django.core import mail
from pytest_django import Settings

from console.models import Organization
from console.selectors import organization_webhook_secret
from jobs.models import Job
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.servers import LocalServer, tls_context
from tests.workers import fresh_worker

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")  # never fetch a browser
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    ViewportSize,
    expect,
    sync_playwright,
)

# The first run in a fresh checkout trains tiny-qwen3 (about a minute alone, more on a
# busy machine) before the walk starts.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e,
              pytest.mark.timeout(900)]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(os.environ.get("ANEX_RUN_DIR", ".run")) / "screenshots"
DESKTOP: ViewportSize = {"width": 1280, "height": 860}
PHONE: ViewportSize = {"width": 390, "height": 844}
PASSWORD = "a long and lovely passphrase"
ROWS = 300


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (`make browser`, "
                    "or apt-get install chromium): the console's browser tests need it")
    # Playwright's sync API keeps an event loop running in this thread, which Django takes
    # for an async context; the test's own database calls are plain synchronous ones.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                                  headless=True, args=CHROMIUM_ARGS)
            yield launched
            launched.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def served(settings: Settings, checkpoint_dirs: dict[str, Path], live_server: Any,  # noqa: F811
           ca: Any, trust_ca: None, loopback: None, monkeypatch: pytest.MonkeyPatch,
           make_server: Callable[..., LocalServer]) -> Iterator[tuple[str, LocalServer]]:
    settings.ANEX_CHECKPOINTS = {"all-minilm-l6-v2": checkpoint_dirs["minilm"],
                                 "tiny-qwen3": checkpoint_dirs["tiny-qwen3"]}
    settings.ANEX_WORKER_MODELS = ["all-minilm-l6-v2"]
    settings.ANEX_CHUNK_ROWS = 2
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    # The upload target and the result link are the live server's (the local storage).
    settings.ANEX_API_ORIGIN = live_server.url
    # The live server speaks plain http.
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = False
    monkeypatch.setattr("console.views.jobs.POLL_MS", 300)
    receiver = make_server(tls=tls_context(ca, "127.0.0.1"))
    with fresh_worker(threads=2):
        yield live_server.url, receiver


def shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    width = page.viewport_size["width"] if page.viewport_size else 0
    suffix = "phone" if width < 600 else "desktop"
    page.screenshot(path=str(SCREENSHOTS / f"{name}-{suffix}.png"), full_page=True)


def mailed_link(to: str, pattern: str) -> str:
    for message in reversed(mail.outbox):
        if to in message.to:
            found = re.search(pattern, str(message.body))
            if found:
                return found.group(0)
    raise AssertionError(f"no mail to {to} with {pattern}")


def sign_up(page: Page, base: str, email: str) -> None:
    page.goto(f"{base}/accounts/signup/")
    page.fill("#id_email", email)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.get_by_role("button", name="Sign Up").click()
    expect(page.get_by_role("heading", name="Verify Your Email Address")).to_be_visible()
    page.goto(mailed_link(email, r"https?://\S+/accounts/confirm-email/\S+/"))
    page.get_by_role("button", name="Confirm").click()
    page.goto(f"{base}/console/jobs")
    if "/accounts/login/" in page.url:  # confirmed in another session: sign in
        page.fill("#id_login", email)
        page.fill("#id_password", PASSWORD)
        page.get_by_role("button", name="Sign In").click()
    page.wait_for_url(re.compile(r"/console/jobs$"))


def confirm_password_if_asked(page: Page) -> None:
    """allauth's re-authentication, which creating a key, the signing secret, the webhook
    endpoint, auto-approve and the Members page's owner actions ask for when the person
    neither signed in nor confirmed the password in the last five minutes (issue 22, L5;
    issue 40 L1): the form's POST is replayed once it is."""
    page.wait_for_load_state()
    if "/accounts/reauthenticate/" in page.url:
        page.fill("#id_password", PASSWORD)
        page.get_by_role("button", name="Confirm").click()
        page.wait_for_load_state()


def csp_violations(page: Page) -> list[str]:
    """What the browser reports refusing under the Content-Security-Policy, from now on."""
    seen: list[str] = []
    page.on("console", lambda message: seen.append(message.text)
            if "Content Security Policy" in message.text else None)
    return seen


def embedding_file(tmp: Path) -> Path:
    path = tmp / "vectors.jsonl"
    path.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                        "url": "/v1/embeddings",
                                        "body": {"input": f"row number {i} of the file"}}) + "\n"
                            for i in range(ROWS)))
    return path


def chat_file(tmp: Path) -> Path:
    path = tmp / "questions.jsonl"
    path.write_text(json.dumps({"custom_id": "q", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"messages": [{"role": "user", "content": "Hi"}]}}) + "\n")
    return path


def visible_models(page: Page) -> list[str]:
    return page.eval_on_selector_all("#id_model option:not([disabled])",
                                     "options => options.map(o => o.value)")


def test_the_console_walk(browser: Browser, served: tuple[str, LocalServer],
                          tmp_path: Path) -> None:
    base, receiver = served
    owner = browser.new_context(viewport=DESKTOP, accept_downloads=True)
    page = owner.new_page()
    refused = csp_violations(page)

    # Sign up, verify from the mail, land on an empty Jobs page that says what to do.
    # Fresh addresses each run: allauth rate-limits confirmation mails per address in the
    # shared cache (Redis), which outlives a test.
    run = uuid.uuid4().hex[:8]
    ada, bob_email = f"ada-{run}@example.com", f"bob-{run}@example.com"
    sign_up(page, base, ada)
    expect(page.get_by_text("No jobs yet — ")).to_be_visible()
    organization = Organization.objects.get(memberships__user__email=ada)

    # A key: the secret shown once, and it works on the API.
    page.get_by_role("link", name="Keys").click()
    page.get_by_label("Name").fill("walk")
    page.get_by_role("button", name="Create key").click()
    confirm_password_if_asked(page)
    plaintext = page.locator("#new-key").input_value()
    assert plaintext.startswith("sk-")
    shoot(page, "keys-new-secret")
    answer = requests.get(f"{base}/batch/v1/jobs/00000000-0000-0000-0000-000000000000",
                          headers={"Authorization": f"Bearer {plaintext}"}, timeout=10)
    assert answer.status_code == 404  # authenticated: the id is simply not there
    page.goto(f"{base}/console/keys")
    assert page.locator("#new-key").count() == 0  # shown once

    # A new job: the dropdown follows the file's endpoint and the model's fields.
    page.get_by_role("link", name="Jobs", exact=True).click()
    page.get_by_role("link", name="New job").click()
    page.set_input_files("#file", str(chat_file(tmp_path)))
    expect(page.locator("#file-endpoint")).to_contain_text("/v1/chat/completions")
    assert "tiny-qwen3" in visible_models(page)
    assert "all-minilm-l6-v2" not in visible_models(page)
    page.select_option("#id_model", "tiny-qwen3")
    expect(page.get_by_label("Thinking", exact=True)).to_be_visible()
    expect(page.get_by_label("Thinking effort")).to_be_visible()
    page.set_input_files("#file", str(embedding_file(tmp_path)))
    expect(page.locator("#file-endpoint")).to_contain_text("/v1/embeddings")
    assert set(visible_models(page)) >= {"all-minilm-l6-v2", "qwen3-embedding-8b"}
    assert "tiny-qwen3" not in visible_models(page)
    page.select_option("#id_model", "all-minilm-l6-v2")
    expect(page.get_by_label("Thinking", exact=True)).to_be_hidden()
    expect(page.get_by_label("Dimensions")).to_be_visible()
    shoot(page, "job-new")
    # Record what the upload's progress bar shows; the tab's sessionStorage keeps it
    # across the navigation to the job page.
    page.evaluate("""() => {
        const bar = document.getElementById("upload-progress"), seen = [];
        new MutationObserver(() => seen.push(bar.value)).observe(bar, {attributes: true});
        addEventListener("pagehide", () => sessionStorage.setItem("upload", JSON.stringify(
            {seen, text: document.getElementById("upload-text").textContent})));
    }""")
    page.get_by_role("button", name="Upload and get an estimate").click()
    page.wait_for_url(re.compile(r"/console/jobs/[0-9a-f-]{36}$"))
    upload = json.loads(page.evaluate("() => sessionStorage.getItem('upload')"))
    assert upload["seen"] and upload["seen"][-1] == 100, upload
    assert upload["text"] == "Uploaded vectors.jsonl. Submitting…"
    job = Job.objects.for_org(organization).get()
    assert job.input is not None and job.input.size_bytes == embedding_file(tmp_path).stat().st_size

    # The estimate arrives on the page by itself.
    status = page.locator("[data-status]")
    expect(status).to_have_attribute("data-status", "cost_ready", timeout=120_000)
    expect(page.locator("#estimate")).to_contain_text("$")
    shoot(page, "job-cost-ready")

    # Approve, and watch the bar move to done, and the job drawn as it runs (issue 44): its
    # rows over time with the ETA line, read in one turn of the page's script (the poller
    # redraws the part).
    page.get_by_role("button", name=re.compile(r"^Approve")).click()
    seen: set[int] = set()
    drawn_running: list[dict[str, Any]] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if page.locator("#rows-done").count():
            seen.add(int(page.locator("#rows-done").inner_text()))
        if status.get_attribute("data-status") == "done":
            break
        if len(seen) == 2:
            shoot(page, "job-running")
        drawn = page.evaluate("""() => ({
            status: document.querySelector("[data-status]").dataset.status,
            done: Number((document.getElementById("rows-done") || {}).textContent || 0),
            rows: Boolean(document.querySelector("#rows-chart svg path.area-finished")),
            eta: Boolean(document.querySelector("#rows-chart svg line.line-eta")),
            cost: Boolean(document.querySelector("#cost-chart svg rect.spent"))})""")
        if drawn["status"] == "in_progress" and 0 < drawn["done"] < ROWS:
            drawn_running.append(drawn)
        time.sleep(0.1)
    expect(status).to_have_attribute("data-status", "done")
    assert any(0 < rows < ROWS for rows in seen), f"the bar never moved: {sorted(seen)}"
    assert any(d["rows"] and d["eta"] and d["cost"] for d in drawn_running), drawn_running
    expect(page.locator("#rows-done")).to_have_text(str(ROWS))
    expect(page.locator("#cost")).to_contain_text("$")
    # Ended: the rows drawn to the last, no ETA, every row succeeded, the charge.
    expect(page.locator("#rows-chart figcaption")).to_contain_text(
        f"{ROWS} of {ROWS} rows done when the job ended")
    expect(page.locator("#rows-chart line.line-eta")).to_have_count(0)
    expect(page.locator("#outcomes-chart tr", has_text="Succeeded")).to_contain_text(str(ROWS))
    expect(page.locator("#cost-chart figcaption")).to_contain_text("Charged")
    shoot(page, "job-done")

    # Download the result: one line per row.
    with page.expect_download() as download:
        page.get_by_role("link", name="Download result").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert len(lines) == ROWS and json.loads(lines[0])["custom_id"].startswith("r")

    # Delete its data, through a confirmation.
    page.get_by_role("link", name="Delete data").click()
    shoot(page, "job-delete-confirm")
    page.get_by_role("button", name="Delete data").click()
    expect(page.get_by_text("data was deleted")).to_be_visible()
    job.refresh_from_db()
    assert job.data_deleted_at is not None
    expect(page.get_by_role("link", name="Download result")).to_have_count(0)

    # Settings: the endpoint, the secret revealed and rotated, the test event delivered.
    page.get_by_role("link", name="Settings").click()
    page.get_by_label("Endpoint URL").fill(receiver.url("/hooks/anex"))
    page.get_by_role("button", name="Save endpoint").click()
    confirm_password_if_asked(page)
    expect(page.get_by_text("Webhook endpoint saved.")).to_be_visible()
    assert page.locator("#signing-secret").count() == 0  # only on Reveal
    page.get_by_role("button", name="Reveal the signing secret").click()
    confirm_password_if_asked(page)
    first_secret = page.locator("#signing-secret").input_value()
    assert first_secret == organization_webhook_secret(organization=organization)
    page.get_by_role("button", name="Rotate secret").click()
    confirm_password_if_asked(page)
    page.get_by_role("button", name="Reveal the signing secret").click()
    confirm_password_if_asked(page)
    secret = page.locator("#signing-secret").input_value()
    assert secret.startswith("whsec_") and secret != first_secret
    page.get_by_role("button", name="Send a test event").click()
    expect(page.locator("#test-result")).to_have_attribute("data-delivery-status", "delivered",
                                                          timeout=60_000)
    expect(page.locator("#test-result")).to_contain_text("answered 200")
    (hit,) = [r for r in receiver.requests if b'"type":"test"' in r.body.replace(b" ", b"")]
    headers = {name.lower(): value for name, value in hit.headers.items()}
    assert standardwebhooks.Webhook(secret).verify(hit.body, headers)["type"] == "test"

    # Auto-approve.
    auto_approve = page.get_by_label("Approve every estimate as soon as it is ready")
    auto_approve.check()
    page.locator("form", has=auto_approve).get_by_role("button", name="Save").click()
    confirm_password_if_asked(page)
    expect(page.get_by_text("Auto-approve is on")).to_be_visible()
    organization.refresh_from_db()
    assert organization.auto_approve
    shoot(page, "settings")

    # Invite a member; they sign up from the mail, join, and cannot open Settings.
    page.get_by_role("link", name="Members").click()
    page.get_by_label("Email").fill(bob_email)
    page.get_by_role("button", name="Send invitation").click()
    expect(page.get_by_text(f"Invitation sent to {bob_email}")).to_be_visible()
    invitation = mailed_link(bob_email, r"https?://\S+/console/invitations/\S+")
    shoot(page, "members")
    member = browser.new_context(viewport=DESKTOP)
    bob = member.new_page()
    sign_up(bob, base, bob_email)
    bob.goto(invitation)
    shoot(bob, "invitation")
    bob.get_by_role("button", name="Accept the invitation").click()
    expect(bob.get_by_text(f"You joined {organization.name}")).to_be_visible()
    expect(bob.get_by_role("link", name="Settings")).to_have_count(0)
    shoot(bob, "member-jobs")  # two organizations now: the switcher is in the header
    expect(bob.get_by_label("Organization")).to_be_visible()
    response = bob.goto(f"{base}/console/settings")
    assert response is not None and response.status == 403
    expect(bob.get_by_role("heading", name="You cannot open this page")).to_be_visible()
    shoot(bob, "member-settings-refused")
    # Bob's own organization (from his sign-up) is one switch away, and there he is owner.
    bob.goto(f"{base}/console/jobs")
    bob.get_by_label("Organization").select_option(label=f"{bob_email.split('@')[0]}'s "
                                                        "organization (owner)")
    bob.get_by_role("button", name="Switch").click()
    expect(bob.get_by_role("link", name="Settings")).to_be_visible()
    member.close()

    # The owner sets Bob's spending limit (issue 40 L7).
    page.goto(f"{base}/console/members")
    page.get_by_label(f"Spending limit of {bob_email} (USD)").fill("25")
    page.get_by_role("button", name=f"Set the limit of {bob_email}").click()
    confirm_password_if_asked(page)
    expect(page.get_by_text(f"{bob_email} now has a spending limit of $25.00.")).to_be_visible()

    assert refused == [], refused  # the walk's pages ran under the policy untouched
    screenshots_of_every_page(browser, owner, base, job.pk)
    owner.close()


def screenshots_of_every_page(browser: Browser, owner: BrowserContext, base: str,
                              job_id: Any) -> None:
    pages = {"jobs": "/console/jobs", "job": f"/console/jobs/{job_id}",
             "job-new": "/console/jobs/new", "keys": "/console/keys",
             "settings": "/console/settings", "members": "/console/members",
             "billing": "/console/billing", "audit": "/console/audit",
             "account-email": "/accounts/email/", "account-2fa": "/accounts/2fa/",
             "account-password": "/accounts/password/change/"}
    public = {"home": "/", "sign-in": "/accounts/login/", "sign-up": "/accounts/signup/",
              "password-reset": "/accounts/password/reset/"}
    state = owner.storage_state()
    for viewport in (DESKTOP, PHONE):
        signed_in = browser.new_context(viewport=viewport, storage_state=state)
        anonymous = browser.new_context(viewport=viewport)
        for context, paths in ((signed_in, pages), (anonymous, public)):
            page = context.new_page()
            refused = csp_violations(page)
            for name, path in paths.items():
                response = page.goto(f"{base}{path}")
                assert response is not None and response.status == 200, path
                shoot(page, f"page-{name}")
            assert refused == [], refused
        signed_in.close()
        anonymous.close()
