"""Worlds for dashboard tests: a real platform process over a seeded home, and Debian's
headless chromium driven by Playwright (never a downloaded browser)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from osmosis.platform import Settings, create_app
from osmosis.platform.core.db.models import User, Workspace
from osmosis.platform.services.users import create_user
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env
from tests.platform import conftest as platform_worlds
from tests.platform.conftest import clean_env, free_port, osmosis
from tests.platform.databases import Databases
from tests.web import seed
from tests.web.local_world import RUNS, Viewer, eval_run, make_view_workspace
from tests.web.seed import XSS, XSS_FILE, Attempt, RunSpec

# Runs A ("base") and B ("candidate") on dataset "math", two attempts per row:
#   row 0: A passes both, B fails both          -> regressed
#   row 1: A passes one, B none                 -> regressed
#   row 2: A none, B both                       -> improved
#   row 3: both 0 passes, B errors (timeout)    -> errored
#   rows 4, 5: the same in both                 -> unchanged
_A = {0: [1, 1], 1: [1, 0], 2: [0, 0], 3: [0, 0], 4: [1, 1], 5: [0, 1]}
_B = {0: [0, 0], 1: [0, 0], 2: [1, 1], 3: [None, None], 4: [1, 1], 5: [0, 1]}
REGRESSED_ROWS = [0, 1]

# A rollout writes its own trajectory: wrong types anywhere must not break the sample page.
MALFORMED_TRAJECTORY = {
    "steps": [
        {
            "step_id": "three",
            "source": "agent",
            "message": {"parts": ["a", "b"]},
            "tool_calls": "not a list",
            "metrics": {"latency_ms": "slow", "cost_usd": "free", "prompt_tokens": "many"},
        },
        "not a step",
        {"source": "user", "message": None, "observation": {"results": [1, "two"]}},
    ],
    "extra": {"osmosis": {"label": {"nested": [1, 2]}, "sample_metrics": "not a mapping"}},
}
LONG_STEPS = 250  # more than a page of steps
# The math dataset's file: the samples pages show each row's prompt from it.
MATH_ROWS = [
    {"user_prompt": f"What is {i} * 7? {XSS}", "ground_truth": str(i * 7)} for i in range(6)
]
ALL_FAILED = "all-broken"  # a finished run whose every attempt failed


def _attempts(rewards: dict[int, list[float | None]]) -> list[Attempt]:
    out = []
    for row, values in rewards.items():
        for k, reward in enumerate(values):
            if reward is None:
                out.append(
                    Attempt(
                        row,
                        k,
                        status="failed",
                        reward=None,
                        error_type="timeout",
                        error_message=f"workflow exceeded its 450s deadline ({XSS})",
                    )
                )
            else:
                out.append(Attempt(row, k, reward=float(reward), tokens=20 + row + k))
    return out


@dataclass(frozen=True)
class Seeded:
    """What the runs list shows of one seeded run, for computing expected filter results."""

    name: str
    status: str
    dataset: str
    model: str
    rollout: str
    workspace: str
    minutes: int


@dataclass
class World:
    url: str
    home: Path
    admin_token: str
    bob_token: str
    bob_run: str
    env: dict[str, str]
    runs: list[Seeded]
    dataset_id: str
    bob_dataset_id: str

    def matching(self, **filters: str) -> list[str]:
        """Names of the admin's runs passing `filters`, newest first, as the page orders them."""
        rows = [r for r in self.runs if all(getattr(r, k) == v for k, v in filters.items())]
        return [r.name for r in sorted(rows, key=lambda r: -r.minutes)]

    def api(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.get(self.url + path, headers=headers, timeout=30)


# The platform's database fixtures, so these worlds run on SQLite and on PostgreSQL too.
pytest_generate_tests = platform_worlds.pytest_generate_tests
database_kind = platform_worlds.database_kind
postgres = platform_worlds.postgres
databases = platform_worlds.databases
module_databases = platform_worlds.module_databases

FILLER = 28  # with base, candidate and all-broken: 31 runs, two pages of 25


def _seed(settings: Settings) -> tuple[str, list[Seeded], str, str]:
    home = settings.home
    app = create_app(settings)
    try:
        with app.state.sessions() as db:
            admin = db.query(User).filter(User.is_admin.is_(True)).one()
            bob = create_user(db, name="bob", email="bob@example.com", is_admin=False)
            evals = seed.workspace(db, identity="acme/evals", owner=admin)
            other = seed.workspace(db, identity="acme/other", owner=admin)
            private = seed.workspace(db, identity="bob/private", owner=bob.user)
            math = seed.dataset(
                db,
                ws=evals,
                user=admin,
                name="math",
                rows=[{"user_prompt": f"6*7 {XSS}", "ground_truth": "42"}],
                blob=(home, MATH_ROWS),
            )
            specs: list[tuple[RunSpec, Workspace]] = []
            for i in range(FILLER):
                specs.append(
                    (
                        RunSpec(
                            name=f"filler-{i:02d}",
                            attempts=[Attempt(0, 0, reward=float(i % 2)), Attempt(1, 0)],
                            status=("finished", "failed", "stopped")[i % 3],
                            dataset=("math", "code")[i % 2],
                            model=("openai/gpt-a", "openai/gpt-b")[(i // 2) % 2],
                            rollout=("alpha", "beta")[(i // 4) % 2],
                            minutes=i,
                        ),
                        (evals, other)[i % 2],
                    )
                )
            specs.append((RunSpec(name="base", attempts=_attempts(_A), n=2, minutes=100), evals))
            specs.append(
                (
                    RunSpec(
                        name=ALL_FAILED,
                        attempts=_attempts({0: [None, None], 1: [None, None]}),
                        n=2,
                        minutes=99,
                    ),
                    evals,
                )
            )
            specs.append(
                (
                    RunSpec(
                        name="candidate",
                        attempts=_attempts(_B),
                        n=2,
                        model="openai/gpt-b",
                        minutes=101,
                        dataset_version_id=math.versions[0].id,
                        secret_scopes={"OPENAI_API_KEY": "user", "EXTRA": "run"},
                        trajectories={
                            "row_0_run_0": seed.tool_trajectory(),
                            "row_1_run_0": MALFORMED_TRAJECTORY,
                            "row_2_run_0": seed.long_trajectory(LONG_STEPS),
                        },
                        artifacts={
                            "row_0_run_0": {
                                "notes/answer.txt": b"the answer is 42\n" + XSS.encode(),
                                "plots/curve.png": seed.png(64, 48),
                                XSS_FILE: b"payload in a file name",
                                "manifest.json": b"{}",
                            }
                        },
                        logs="2026-11-01T13:41:00.000+00:00 [platform] started worker\n"
                        f"2026-11-01T13:41:01.000+00:00 [rollout] {XSS}\n",
                    ),
                    evals,
                )
            )
            seeded = []
            for spec, ws in specs:
                seed.seed_run(db, home, ws=ws, user=admin, spec=spec)
                seeded.append(
                    Seeded(
                        name=spec.name,
                        status=spec.status,
                        dataset=spec.dataset,
                        model=spec.model,
                        rollout=spec.rollout,
                        workspace=ws.identity,
                        minutes=spec.minutes,
                    )
                )
            seed.seed_run(
                db,
                home,
                ws=private,
                user=bob.user,
                spec=RunSpec(
                    name="bob-private-run",
                    attempts=[Attempt(0, 0)],
                    minutes=50,
                    trajectories={"row_0_run_0": seed.tool_trajectory()},
                    artifacts={"row_0_run_0": {"bob.txt": b"bob's own"}},
                ),
            )
            bobs = seed.dataset(
                db, ws=private, user=bob.user, name="bob-data", rows=[{"user_prompt": "hi"}]
            )
            db.commit()
            return bob.issued.secret, seeded, math.id, bobs.id
    finally:
        app.state.engine.dispose()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, module_databases: Databases) -> Iterator[World]:
    """A seeded home served by `osmosis server start --detach` on a free loopback port."""
    root = tmp_path_factory.mktemp("dashboard")
    home = root / "home"
    bob_token, runs, dataset_id, bob_dataset_id = _seed(module_databases.settings(home))
    env = clean_env(
        OSMOSIS_HOME=str(home),
        OSMOSIS_CONFIG_DIR=str(root / "config"),
        **module_databases.env(home),
    )
    port = free_port()
    started = osmosis("server", "start", "--detach", "--port", str(port), env=env)
    assert started.returncode == 0, started.stderr + started.stdout
    token = str(json.loads((home / "credentials.json").read_text())["token"])
    try:
        yield World(
            url=f"http://127.0.0.1:{port}",
            home=home,
            admin_token=token,
            bob_token=bob_token,
            bob_run="bob-private-run",
            env=env,
            runs=runs,
            dataset_id=dataset_id,
            bob_dataset_id=bob_dataset_id,
        )
    finally:
        osmosis("server", "stop", env=env)


# -- the browser ---------------------------------------------------------------------------------
def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "Debian's chromium is not installed: `apt-get install -y chromium` "
            "(.ci/run installs it; Playwright's own browser downloads are not used)"
        )
    return found


# Module scope: sync Playwright keeps an event loop running in this thread while it lives,
# and pytest-asyncio cannot run the async tests a worker picks up after a browser module.
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=["--no-sandbox"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: object, tmp_path: Path) -> Iterator[object]:
    """A fresh browser context (no cookies) whose pages record script dialogs."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})  # type: ignore[attr-defined]
    tab = context.new_page()
    tab.dialogs = []
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()


def sign_in(page: object, url: str, token: str) -> None:
    """Sign in through the login form, as a person would."""
    page.goto(url + "/login")  # type: ignore[attr-defined]
    page.fill("#token", token)  # type: ignore[attr-defined]
    page.click("button[type=submit]")  # type: ignore[attr-defined]
    page.wait_for_url(url + "/")  # type: ignore[attr-defined]


def login(page: object, world: World, token: str | None = None) -> None:
    sign_in(page, world.url, token or world.admin_token)


def shot(page: Any, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot of `page` as `<tmp_path>/<name>.png`, not blank. Headless
    Chromium now and then refuses one on a loaded machine ("Unable to capture screenshot", a
    compositor that missed its frame): asked again, at most three times in all."""
    from playwright.sync_api import Error as PlaywrightError

    path = tmp_path / f"{name}.png"
    for attempt in range(3):
        try:
            page.screenshot(path=str(path), full_page=True)
            break
        except PlaywrightError as error:
            if "Unable to capture screenshot" not in str(error) or attempt == 2:
                raise
            page.wait_for_timeout(200)
    assert path.stat().st_size > 1000
    return path


def follow(page: Any, selector: str) -> None:
    """Click a link and wait for the page it opens to load. A bare click returns once the
    navigation has started, and a DOM read right after it (`count()`, `evaluate_all`, which
    do not wait for elements) can see a document still being parsed."""
    with page.expect_navigation():
        page.click(selector)


# -- local runs under `osmosis eval view` --------------------------------------------------------
@dataclass
class LocalWorld:
    """Runs `osmosis eval run` wrote (see local_world.py), served by `osmosis eval view`."""

    evals: Path
    config: Path
    env: dict[str, str]
    viewer: Viewer

    @property
    def url(self) -> str:
        return self.viewer.url

    def run_dir(self, name: str) -> Path:
        return self.evals / name


@pytest.fixture(scope="session")
def local_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalWorld]:
    root = tmp_path_factory.mktemp("view")
    config = make_view_workspace(root / "ws")
    evals = root / "ws" / ".osmosis" / "evals"
    with FakeModelServer() as model:
        env = model_env(model)
        started = [
            eval_run(config, name, variant, env, wait=False) for name, variant in RUNS.items()
        ]
        for name, process in zip(RUNS, started, strict=True):
            output, _ = process.communicate(timeout=300)
            # Every attempt of `broken` errors: that run exits with its own code (issue 27).
            assert process.returncode == (5 if name == "broken" else 0), output
        viewer = Viewer.start(evals, free_port(), env)
        try:
            yield LocalWorld(evals=evals, config=config, env=env, viewer=viewer)
        finally:
            viewer.stop()
