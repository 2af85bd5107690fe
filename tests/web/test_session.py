"""Sign-in, the session cookie and CSRF, through the app in process (no browser needed):
every state-changing form without the session's CSRF token is refused with 403."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osmosis.platform import create_app
from osmosis.platform.core.db.models import ApiToken, User, Workspace, utcnow
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.db.web_models import WebSession
from osmosis.platform.web.session import COOKIE
from tests.platform.databases import Databases
from tests.web import seed
from tests.web.seed import RunSpec


@dataclass
class App:
    client: TestClient
    token: str
    sessions: object


@pytest.fixture
def app(tmp_path: Path, databases: Databases) -> Iterator[App]:
    settings = databases.settings(tmp_path / "home")
    platform = create_app(settings)
    with platform.state.sessions() as db:
        admin = db.query(User).one()
        ws = seed.workspace(db, identity="acme/evals", owner=admin)
        seed.seed_run(
            db,
            settings.home,
            ws=ws,
            user=admin,
            spec=RunSpec(name="waiting", attempts=[], status="pending"),
        )
        db.commit()
    token = json.loads(settings.credentials_file.read_text())["token"]
    # No `with`: the scheduler (started by the lifespan) stays off, so "pending" stays put.
    yield App(client=TestClient(platform), token=token, sessions=platform.state.sessions)
    platform.state.engine.dispose()


def form_token(client: TestClient, path: str) -> str:
    page = client.get(path, headers={"accept": "text/html"})
    assert page.status_code == 200, page.text
    return re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)


def sign_in(app: App) -> str:
    csrf = form_token(app.client, "/login")
    answer = app.client.post(
        "/login", data={"token": app.token, "csrf_token": csrf}, follow_redirects=False
    )
    assert answer.status_code == 303
    return form_token(app.client, "/runs/waiting")  # the signed-in session's token


def signed_in(client: TestClient) -> bool:
    answer = client.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert answer.status_code in {200, 303}, answer.text
    return answer.status_code == 200


def status_of(app: App, name: str) -> str:
    with app.sessions() as db:  # type: ignore[operator]
        return db.query(EvalRun).filter_by(name=name).one().status


def test_login_without_or_with_a_foreign_csrf_token_is_refused(app: App):
    answer = app.client.post("/login", data={"token": app.token}, follow_redirects=False)
    assert answer.status_code == 403
    assert "CSRF" in answer.json()["error"]["message"]
    # A token from another visitor's session is no better than none.
    other = TestClient(app.client.app)
    foreign = form_token(other, "/login")
    form_token(app.client, "/login")
    answer = app.client.post(
        "/login", data={"token": app.token, "csrf_token": foreign}, follow_redirects=False
    )
    assert answer.status_code == 403
    assert not signed_in(app.client)


@pytest.mark.parametrize("submitted", [None, "", "forged-token"])
def test_stop_and_logout_without_the_sessions_csrf_token_change_nothing(app: App, submitted):
    sign_in(app)
    data = {} if submitted is None else {"csrf_token": submitted}
    stop = app.client.post("/runs/waiting/stop", data=data, follow_redirects=False)
    assert stop.status_code == 403
    assert status_of(app, "waiting") == "pending"
    out = app.client.post("/logout", data=data, follow_redirects=False)
    assert out.status_code == 403
    assert signed_in(app.client)


def test_stop_with_the_csrf_token_stops_a_pending_run(app: App):
    csrf = sign_in(app)
    stop = app.client.post("/runs/waiting/stop", data={"csrf_token": csrf}, follow_redirects=False)
    assert stop.status_code == 303 and stop.headers["location"] == "/runs/waiting"
    assert status_of(app, "waiting") == "stopped"
    page = app.client.get("/runs/waiting")
    assert "stop-form" not in page.text  # no Stop button on an ended run
    # A second click (a stale page) lands on the run's page, not on a Conflict error.
    again = app.client.post("/runs/waiting/stop", data={"csrf_token": csrf})
    assert again.status_code == 200 and "stopped" in again.text
    assert str(again.url).endswith("/runs/waiting")


def test_a_script_with_a_bearer_token_needs_no_csrf_token(app: App):
    client = TestClient(app.client.app, headers={"Authorization": f"Bearer {app.token}"})
    assert client.get("/").status_code == 200
    stop = client.post("/runs/waiting/stop", follow_redirects=False)
    assert stop.status_code == 303
    assert status_of(app, "waiting") == "stopped"
    bad = TestClient(app.client.app, headers={"Authorization": "Bearer osm_nope"})
    answer = bad.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert answer.status_code == 401  # a script gets the error, not a login page
    assert answer.json()["error"]["code"] == "AUTH_REQUIRED"


def test_logout_ends_the_session(app: App):
    csrf = sign_in(app)
    out = app.client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    answer = app.client.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"].startswith("/login")


def copy_of(client: TestClient) -> TestClient:
    """Another browser holding the same session cookie (a stolen or copied one)."""
    copy = TestClient(client.app)
    copy.cookies.set(COOKIE, client.cookies[COOKIE])
    return copy


def test_a_cookie_copied_before_sign_out_is_refused_after_it(app: App):
    csrf = sign_in(app)
    copy = copy_of(app.client)
    assert signed_in(copy)  # the copy works while the session lives
    out = app.client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert out.status_code == 303
    assert not signed_in(copy)
    page = copy.get("/runs/waiting", headers={"accept": "text/html"}, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"].startswith("/login")
    # The copy still holds the CSRF token that matched the cookie, and it cannot stop a run.
    stop = copy.post(
        "/runs/waiting/stop",
        data={"csrf_token": csrf},
        headers={"accept": "text/html"},
        follow_redirects=False,
    )
    assert stop.status_code == 303 and stop.headers["location"].startswith("/login")
    assert status_of(app, "waiting") == "pending"


def test_signing_in_again_ends_the_earlier_session(app: App):
    sign_in(app)
    earlier = copy_of(app.client)
    sign_in(app)
    assert signed_in(app.client)
    assert not signed_in(earlier)


def test_signing_out_keeps_the_api_token_working(app: App):
    csrf = sign_in(app)
    app.client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    script = TestClient(app.client.app, headers={"Authorization": f"Bearer {app.token}"})
    assert script.get("/api/auth/whoami").status_code == 200
    assert script.get("/").status_code == 200
    sign_in(app)  # and the same token signs in again
    assert signed_in(app.client)


def test_an_expired_session_is_refused(app: App):
    sign_in(app)
    assert signed_in(app.client)
    with app.sessions() as db:  # type: ignore[operator]
        for row in db.query(WebSession):
            row.expires_at = utcnow() - timedelta(seconds=1)
        db.commit()
    assert not signed_in(app.client)


def test_revoking_the_token_ends_its_sessions(app: App):
    sign_in(app)
    with app.sessions() as db:  # type: ignore[operator]
        for token in db.query(ApiToken):
            token.revoked_at = utcnow()
        db.commit()
    assert not signed_in(app.client)


def test_a_tampered_cookie_is_no_session(app: App):
    sign_in(app)
    value = app.client.cookies[COOKIE].strip('"')
    middle = len(value) // 2
    tampered = value[:middle] + ("A" if value[middle] != "A" else "B") + value[middle + 1 :]
    app.client.cookies.clear()
    app.client.cookies.set(COOKIE, tampered)
    assert not signed_in(app.client)


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/\\evil"])
def test_login_never_redirects_off_the_site(app: App, target):
    csrf = form_token(app.client, "/login")
    answer = app.client.post(
        "/login",
        data={"token": app.token, "csrf_token": csrf, "next": target},
        follow_redirects=False,
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/"


def test_an_https_request_gets_a_secure_cookie(app: App):
    client = TestClient(app.client.app, base_url="https://platform.test")
    answer = client.get("/login")
    cookie = answer.headers["set-cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie


def test_api_errors_stay_json_for_browsers(app: App):
    answer = app.client.get("/api/eval-runs/nope", headers={"accept": "text/html"})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "AUTH_REQUIRED"


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/runs/waiting/samples?min_reward=lots", "min_reward must be a number"),
        ("/?offset=-3", "offset"),
        ("/runs/waiting/samples?sort=colour", "sort must be one of"),
        ("/runs/nope", "not found among your workspaces"),
        # Numbers too large for the database are refused, not a 500.
        ("/?offset=99999999999999999999", "offset"),
        ("/runs/waiting/samples?offset=9223372036854775808", "offset"),
        ("/runs/waiting/samples/99999999999999999999/0", "row_index"),
        ("/runs/waiting/samples/0/0?offset=99999999999999999999", "offset"),
        ("/compare?a=waiting&b=waiting&offset=99999999999999999999", "offset"),
        # Every problem with the reward range at once; not-a-number is not a bound.
        (
            "/runs/waiting/samples?min_reward=nan&max_reward=lots",
            "min_reward must be a number, such as 0.5; got &#39;nan&#39;; "
            "max_reward must be a number",
        ),
        ("/runs/waiting/samples?min_reward=1&max_reward=0", "min_reward (1) is above max_reward"),
    ],
)
def test_bad_page_requests_get_an_html_page_naming_the_problem(app: App, path, says):
    sign_in(app)
    answer = app.client.get(path, headers={"accept": "text/html"})
    assert answer.status_code in {404, 422}
    assert answer.headers["content-type"].startswith("text/html")
    assert says in answer.text
    assert re.search(r"<title>(Invalid request|Not found) · osmosis</title>", answer.text)


def test_the_histogram_holds_the_graded_attempts_and_no_skipped_one(app: App):
    with app.sessions() as db:  # type: ignore[operator]
        admin = db.query(User).one()
        ws = db.query(Workspace).one()
        seed.seed_run(
            db,
            app.client.app.state.settings.home,  # type: ignore[attr-defined]
            ws=ws,
            user=admin,
            spec=RunSpec(
                name="with-skips",
                attempts=[
                    seed.Attempt(0, 0, reward=1.0),
                    seed.Attempt(1, 0, reward=0.0),
                    seed.Attempt(2, 0, status="skipped", reward=1.0),  # remove_sample
                ],
            ),
        )
        db.commit()
    sign_in(app)
    page = app.client.get("/runs/with-skips").text
    assert re.search(r'id="counts">2 graded · <a [^>]*data-outcome="passed">1 passed</a>', page)
    assert re.search(r'data-outcome="skipped">1 skipped</a>', page)
    bars = [int(c) for c in re.findall(r'class="bar"[^>]*data-count="(\d+)"', page)]
    assert sum(bars) == 2
