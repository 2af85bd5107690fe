"""The official CLI's browser login (RFC 8628 device flow) against a real platform process:
the official `osmosis auth login` (from .venv-interop) prints a code, a person signed in to the
dashboard in Debian's chromium approves or denies it on `/device`, and the CLI hears the
answer. Approving gives the CLI a new token of that person's, which `auth whoami` then shows.
"""

from __future__ import annotations

import queue
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, update

from osmosis.platform.core.db.web_models import DeviceLogin
from osmosis.platform.services.device_login import normalise_user_code
from tests.platform.conftest import RunningPlatform, clean_env
from tests.platform.conftest import running_platform as running_platform  # the world
from tests.web.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.interop, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OFFICIAL = REPO / ".venv-interop" / "bin" / "osmosis"
USER_CODE = re.compile(r"^\s*([B-DF-HJ-NP-TV-XZ]{4}-[B-DF-HJ-NP-TV-XZ]{4})\s*$")
ADMIN_EMAIL = "admin@osmosis.invalid"  # the first admin has no email; /api/cli shows this one


@dataclass
class Login:
    """A running official `osmosis auth login`, its output read line by line as it comes."""

    process: subprocess.Popen[str]
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    @classmethod
    def start(cls, platform: RunningPlatform, home: Path) -> Login:
        env = clean_env(
            HOME=str(home),
            OSMOSIS_PLATFORM_URL=platform.url,
            OSMOSIS_TOKEN_STORE="file",
            NO_COLOR="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop("XDG_CONFIG_HOME", None)
        # stdin is not a terminal: the CLI prints the code and the URL and opens no browser.
        process = subprocess.Popen(
            [str(OFFICIAL), "auth", "login"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        login = cls(process=process, env=env)
        threading.Thread(target=login._read, daemon=True).start()
        return login

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 60) -> re.Match[str]:
        """The first line from here on matching `pattern`, once the CLI has printed it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if found := pattern.search(line):
                return found
        raise AssertionError(f"the official CLI never printed {pattern.pattern!r}:\n{self.output}")

    def user_code(self) -> str:
        """The code the CLI shows, once it has shown it and where to take it."""
        code = self.wait_for(USER_CODE).group(1)
        self.wait_for(re.compile("Open this URL in your browser"))
        return code

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout=timeout)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return code

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def said(self) -> str:
        """The output with rich's line wrapping undone."""
        return " ".join(self.output.split())

    def official(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(OFFICIAL), *args], env=self.env, capture_output=True, text=True, timeout=120
        )


@pytest.fixture
def login(running_platform: RunningPlatform, tmp_path: Path) -> Iterator[Login]:
    if not OFFICIAL.exists():
        pytest.fail("no .venv-interop: `make install` builds it with the official osmosis-ai")
    started = Login.start(running_platform, tmp_path / "home")
    yield started
    started.stop()


def _tokens(platform: RunningPlatform) -> list[dict]:
    headers = {"Authorization": f"Bearer {platform.admin_token}"}
    listed = httpx.get(platform.url + "/api/auth/tokens", headers=headers, timeout=30)
    assert listed.status_code == 200, listed.text
    return list(listed.json()["tokens"])


def test_approving_in_the_browser_signs_the_official_cli_in(
    running_platform: RunningPlatform, login: Login, page, tmp_path: Path
):
    code = login.user_code()
    assert f"{running_platform.url}/device?user_code={code}" in login.output
    sign_in(page, running_platform.url, running_platform.admin_token)

    # A form posted without the session's CSRF token changes nothing.
    forged = page.request.post(
        running_platform.url + "/device", form={"user_code": code, "decision": "approve"}
    )
    assert forged.status == 403

    page.goto(f"{running_platform.url}/device?user_code={code}")
    assert page.inner_text("#user-code") == code
    assert page.inner_text("#device-name") == socket.gethostname()  # what the CLI sent
    page.screenshot(path=str(tmp_path / "device.png"), full_page=True)
    page.click("#approve")
    assert "Approved" in page.inner_text("#device-result")

    assert login.finish() == 0, login.output
    assert "Login Successful" in login.said and f"Email: {ADMIN_EMAIL}" in login.said

    whoami = login.official("--json", "auth", "whoami")
    assert whoami.returncode == 0, whoami.stderr + whoami.stdout
    assert f'"email": "{ADMIN_EMAIL}"' in whoami.stdout
    assert '"source": "credentials"' in whoami.stdout  # the saved login, no OSMOSIS_TOKEN
    (issued,) = [t for t in _tokens(running_platform) if t["name"].startswith("device login: ")]
    assert issued["id"] in whoami.stdout
    assert issued["revoked_at"] is None
    expires = datetime.fromisoformat(issued["expires_at"])
    assert datetime.now(UTC) + timedelta(days=1) < expires  # a lasting login, not a stub

    # The code is used up: the page says so instead of offering Approve again.
    page.goto(f"{running_platform.url}/device?user_code={code}")
    assert "already approved" in page.inner_text("[role=alert]")
    assert page.locator("#approve").count() == 0


def test_denying_in_the_browser_is_what_the_official_cli_reports(
    running_platform: RunningPlatform, login: Login, page
):
    code = login.user_code()
    sign_in(page, running_platform.url, running_platform.admin_token)
    page.goto(f"{running_platform.url}/device")  # no code in the URL: typed in by hand
    page.fill("#user_code", code.lower().replace("-", ""))
    page.click("form[action='/device'] button[type=submit]")
    assert page.inner_text("#user-code") == code
    page.click("#deny")
    assert "Denied" in page.inner_text("#device-result")

    assert login.finish() == 1, login.output
    assert "Authorization was denied." in login.said
    whoami = login.official("--json", "auth", "whoami")
    assert whoami.returncode != 0  # nothing was saved


def test_an_expired_code_ends_the_official_login_and_cannot_be_approved(
    running_platform: RunningPlatform, login: Login, page
):
    code = login.user_code()
    # Ten minutes pass (the code's lifetime): moved back in the server's own database.
    engine = create_engine(running_platform.database_url)
    try:
        with engine.begin() as connection:
            moved = connection.execute(
                update(DeviceLogin)
                .where(DeviceLogin.user_code == normalise_user_code(code))
                .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
            assert moved.rowcount == 1
    finally:
        engine.dispose()

    assert login.finish() == 1, login.output
    assert "Device code expired" in login.said

    sign_in(page, running_platform.url, running_platform.admin_token)
    page.goto(f"{running_platform.url}/device?user_code={code}")
    assert "has expired" in page.inner_text("[role=alert]")
    assert page.locator("#approve").count() == 0


def test_the_token_endpoint_speaks_rfc_8628(running_platform: RunningPlatform):
    """What a poller hears before anyone decides: pending, then slow_down when too eager;
    an unknown device code is refused; once approved, one poll collects the token."""
    url = running_platform.url + "/api/cli/device"
    started = httpx.post(url + "/authorize", json={"deviceName": "ci-box"}, timeout=30)
    assert started.status_code == 200, started.text
    body = started.json()
    assert USER_CODE.match(body["user_code"])
    assert body["verification_uri"] == running_platform.url + "/device"
    assert body["verification_uri_complete"].endswith(f"?user_code={body['user_code']}")
    assert body["expires_in"] == 600 and body["interval"] == 5
    poll = {"device_code": body["device_code"]}
    first = httpx.post(url + "/token", json=poll, timeout=30)
    assert (first.status_code, first.json()["error"]) == (400, "authorization_pending")
    again = httpx.post(url + "/token", json=poll, timeout=30)
    assert (again.status_code, again.json()["error"]) == (400, "slow_down")
    unknown = httpx.post(url + "/token", json={"device_code": "nope"}, timeout=30)
    assert (unknown.status_code, unknown.json()["error"]) == (400, "invalid_grant")

    # A script approves with its token (no cookie, so no CSRF token needed); the next poll
    # collects a working token, and the code is then spent.
    bearer = {"Authorization": f"Bearer {running_platform.admin_token}"}
    approved = httpx.post(running_platform.url + "/device", headers=bearer, timeout=30,
                          data={"user_code": body["user_code"], "decision": "approve"})  # fmt: skip
    assert approved.status_code == 200 and "Approved" in approved.text
    collected = httpx.post(url + "/token", json=poll, timeout=30)
    assert collected.status_code == 200, collected.text
    token = collected.json()
    assert token["user"]["name"] == "admin" and token["user"]["email"] == ADMIN_EMAIL
    assert datetime.fromisoformat(token["expires_at"]) > datetime.now(UTC) + timedelta(days=1)
    verified = httpx.get(running_platform.url + "/api/cli/verify", timeout=30,
                         headers={"Authorization": f"Bearer {token['token']}"})  # fmt: skip
    assert verified.status_code == 200 and verified.json()["token_id"] == token["token_id"]
    spent = httpx.post(url + "/token", json=poll, timeout=30)
    assert (spent.status_code, spent.json()["error"]) == (400, "invalid_grant")
    assert "already exchanged" in spent.json()["message"]
