"""The dashboard in Debian's headless chromium against a real platform process with seeded
runs: what a person signing in, filtering, reading a run and its samples, and comparing two
runs would see. Each test saves screenshots of the pages it visits under its tmp_path."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from osmosis.platform.web.render import number, percent
from osmosis.platform.web.trajectory import STEPS_PER_PAGE
from tests.platform.conftest import osmosis
from tests.web.conftest import ALL_FAILED, LONG_STEPS, REGRESSED_ROWS, World, follow, login, shot
from tests.web.seed import XSS, XSS_FILE

pytestmark = pytest.mark.browser


def run_names(page) -> list[str]:
    return page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)")


def no_script_ran(page) -> None:
    assert page.dialogs == []
    assert page.evaluate("typeof window.__xss") == "undefined"


def test_pages_redirect_to_login_and_a_token_signs_in_with_a_safe_cookie(
    world: World, page, tmp_path
):
    page.goto(world.url + "/runs/base/samples")
    assert urlparse(page.url).path == "/login"
    assert parse_qs(urlparse(page.url).query)["next"] == ["/runs/base/samples"]
    shot(page, tmp_path, "login")

    page.fill("#token", "osm_not-a-real-token")
    page.click("button[type=submit]")
    assert "not valid" in page.inner_text("[role=alert]")
    assert urlparse(page.url).path == "/login"

    page.fill("#token", world.admin_token)
    page.click("button[type=submit]")
    page.wait_for_url(world.url + "/runs/base/samples")  # back where the visitor was going
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "osmosis_session"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Lax"
    assert cookie["secure"] is False  # plain http on loopback; https requests get Secure
    assert world.admin_token not in cookie["value"]  # the cookie never carries the token

    page.click("text=Sign out")
    page.wait_for_url(re.compile(r".*/login$"))
    page.goto(world.url + "/")
    assert urlparse(page.url).path == "/login"


def test_runs_list_filters_combine_stay_in_the_url_and_page(world: World, page, tmp_path):
    login(page, world)
    assert run_names(page) == world.matching()[:25]
    assert page.inner_text(".pager .where") == f"1\u201325 of {len(world.runs)}"
    shot(page, tmp_path, "runs")
    follow(page, "a[rel=next]")
    assert run_names(page) == world.matching()[25:]

    page.goto(world.url + "/")
    page.select_option("select[name=status]", "finished")
    page.select_option("select[name=dataset]", "math")
    follow(page, "#run-filters button[type=submit]")
    query = parse_qs(urlparse(page.url).query)
    assert query == {"status": ["finished"], "dataset": ["math"]}
    assert run_names(page) == world.matching(status="finished", dataset="math")
    assert "base" in run_names(page) and "candidate" in run_names(page)

    page.select_option("select[name=model]", "openai/gpt-b")
    follow(page, "#run-filters button[type=submit]")
    expected = world.matching(status="finished", dataset="math", model="openai/gpt-b")
    assert run_names(page) == expected and "base" not in expected
    shot(page, tmp_path, "runs-filtered")

    # Paging keeps the filters: workspace + rollout, three at a time.
    page.goto(world.url + "/?workspace=acme/other&rollout=beta&limit=3")
    expected = world.matching(workspace="acme/other", rollout="beta")
    seen = run_names(page)
    while page.locator("a[rel=next]").count():
        follow(page, "a[rel=next]")
        query = parse_qs(urlparse(page.url).query)
        assert query["workspace"] == ["acme/other"] and query["rollout"] == ["beta"]
        seen += run_names(page)
    assert seen == expected and len(expected) > 3

    row = page.locator("#runs tbody tr").first
    cells = row.locator("td").all_inner_texts()
    assert cells[1] in {"finished", "failed", "stopped"}
    assert cells[2] == "2/2"  # progress
    assert cells[-1] == "admin"  # submitted by


def eval_info(world: World, name: str) -> dict:
    """`osmosis --json eval info NAME`, run as a user would, against the world's server."""
    env = {**world.env, "OSMOSIS_PLATFORM_URL": world.url, "OSMOSIS_TOKEN": world.admin_token}
    done = osmosis("--json", "eval", "info", name, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["data"]


@pytest.mark.parametrize("name", ["base", "candidate"])
def test_run_page_numbers_equal_eval_info_json(world: World, page, tmp_path, name):
    detail = eval_info(world, name)
    api = world.api(f"/api/eval-runs/{name}").json()
    assert {key: detail[key] for key in api} == api  # eval info shows the API's detail
    summary, metrics = detail["summary"], detail["metrics"]["summary"]
    login(page, world)
    page.goto(world.url + f"/runs/{name}")
    shot(page, tmp_path, f"run-{name}")

    below = summary["progress"]["completed"] - summary["passed"]
    below -= summary["failed"] + summary["skipped"]
    assert page.inner_text("#counts") == (
        f"{summary['graded']} graded · {summary['passed']} passed, {below} not passed, "
        f"{summary['failed']} errored, {summary['skipped']} skipped"
    )
    assert page.inner_text("#pass-rate") == percent(summary["pass_rate"])
    assert page.inner_text("#avg-reward") == number(summary["avg_reward"])
    assert page.inner_text("#tokens") == f"{summary['total_tokens']:,}"
    assert page.inner_text("#pass-threshold") == str(summary["pass_threshold"])
    assert page.inner_text("#pass-at-k") == ", ".join(
        f"{p['k']}: {percent(p['value'])}" for p in metrics["pass_at_k"]
    )
    assert page.inner_text("#pass-hat-k") == ", ".join(
        f"{p['k']}: {percent(p['value'])}" for p in metrics["pass_hat_k"]
    )
    stats = metrics["reward_stats"]
    assert page.inner_text("#reward-stats") == (
        f"mean {number(stats['mean'])}, std {number(stats['std'])}, min {number(stats['min'])}, "
        f"median {number(stats['median'])}, max {number(stats['max'])}"
    )
    ci = metrics["confidence_intervals"]["pass_rate"]
    shown_ci = page.inner_text("#pass-rate-ci")
    assert f"CI {percent(ci['low'])} \u2013 {percent(ci['high'])}" in shown_ci
    assert ci["method"].replace("_", " ") in shown_ci  # the interval says how it was made
    assert page.inner_text("#cost") == f"${detail['cost_usd']:.4f}"
    errors = page.locator("#errors tbody tr").all_inner_texts()
    assert [e.split("\t") for e in errors] == [
        [kind, str(count)] for kind, count in detail["errors_by_type"].items()
    ]
    # The charts are SVG drawn by the server: one bar per reward bin, one point per k.
    bars = page.locator("#reward-histogram rect.bar").evaluate_all(
        "bars => bars.map(b => Number(b.dataset.count))"
    )
    assert sum(bars) == summary["graded"]
    points = page.locator("#pass-at-k-chart circle.point").evaluate_all(
        "ps => ps.map(p => [Number(p.dataset.k), Number(p.dataset.value)])"
    )
    assert points == [[p["k"], pytest.approx(p["value"], abs=1e-6)] for p in metrics["pass_at_k"]]
    assert page.inner_text("#progress").startswith(
        f"{summary['progress']['completed']}/{summary['progress']['total']} samples"
    )
    # A personal secret is called so (the API's wire value is `user`).
    scopes = {"base": "OPENAI_API_KEY (workspace)", "candidate": "OPENAI_API_KEY (personal)"}
    assert scopes[name] in page.inner_text("#configuration")
    # Downloads are the API's bytes.
    with page.expect_download() as download:
        page.click("#downloads >> text=metrics.json")
    saved = Path(download.value.path()).read_bytes()
    assert saved == world.api(f"/api/eval-runs/{name}/files/metrics.json").content


def test_samples_sort_filter_and_page(world: World, page, tmp_path):
    login(page, world)
    page.goto(world.url + "/runs/candidate/samples")
    rows = page.locator("#samples tr.attempt")
    assert rows.count() == 12
    shot(page, tmp_path, "samples")

    page.select_option("select[name=outcome]", "errored")
    follow(page, "#sample-filters button[type=submit]")
    assert parse_qs(urlparse(page.url).query) == {"outcome": ["errored"]}
    cells = page.locator("#samples tr.attempt").all_inner_texts()
    assert len(cells) == 2 and all("timeout" in line for line in cells)
    # The error's message, not only its type, and the row's prompt from the dataset file.
    assert all("exceeded its 450s deadline" in line for line in cells)
    assert "What is 3 * 7?" in page.inner_text("#samples tbody[data-row='3'] .row-head")

    page.goto(world.url + "/runs/candidate/samples?min_reward=1&limit=2")
    seen = []
    while True:
        seen += page.locator("#samples tr.attempt").evaluate_all(
            "rows => rows.map(r => [Number(r.dataset.row), Number(r.dataset.attempt)])"
        )
        if not page.locator("a[rel=next]").count():
            break
        follow(page, "a[rel=next]")
        assert parse_qs(urlparse(page.url).query)["min_reward"] == ["1"]
    assert seen == [[2, 0], [2, 1], [4, 0], [4, 1], [5, 1]]

    page.goto(world.url + "/runs/candidate/samples?view=attempts")
    follow(page, "a[data-sort=reward]")
    follow(page, "a[data-sort=reward]")  # a second click sorts descending
    assert parse_qs(urlparse(page.url).query)["sort"] == ["-reward"]
    rewards = page.locator("#samples td.reward").all_inner_texts()
    assert rewards[:5] == ["1.0000"] * 5 and rewards[-2:] == ["—", "—"]


def test_a_trajectory_with_tool_calls_renders_as_a_conversation(world: World, page, tmp_path):
    login(page, world)
    page.goto(world.url + "/runs/candidate/samples")
    page.click("#samples tr.attempt[data-row='0'][data-attempt='0'] a")
    page.wait_for_url(re.compile(r".*/runs/candidate/samples/0/0$"))
    shot(page, tmp_path, "sample")

    roles = page.locator("#trajectory article").evaluate_all("a => a.map(x => x.dataset.role)")
    assert roles == ["system", "user", "assistant", "assistant"]
    call = page.locator(".tool-call").first
    assert "multiply" in call.inner_text() and '"a": 6' in call.inner_text()
    assert page.locator(".tool-result pre").inner_text() == "42"
    metrics = page.locator("#trajectory article").nth(2).locator(".call-metrics").inner_text()
    assert "21 prompt + 9 completion tokens" in metrics and "812 ms" in metrics
    assert page.inner_text("#label") == "42"
    grade = page.inner_text("#grade")
    assert "exact_match" in grade and "below threshold 1.0" in grade


def test_artifacts_show_as_a_tree_with_text_and_image_previews(world: World, page, tmp_path):
    login(page, world)
    page.goto(world.url + "/runs/candidate/samples/0/0")
    files = page.locator("#artifacts a.file").all_inner_texts()
    assert sorted(files) == sorted(["answer.txt", "curve.png", XSS_FILE])  # no manifest.json
    page.click("#artifacts a.file >> text=answer.txt")
    assert page.inner_text("#preview pre").startswith("the answer is 42")
    shot(page, tmp_path, "artifact-text")

    page.click("#artifacts a.file >> text=curve.png")
    page.locator("#preview img").wait_for()
    # The element appears before its picture has loaded: wait for the load itself.
    # A function, not an expression: Playwright eval()s an expression again on every poll, from
    # the page's own timers, where the dashboard's CSP (no 'unsafe-eval') refuses it; a function
    # is eval()ed once, on the first check, and then called.
    page.wait_for_function("() => document.querySelector('#preview img').complete")
    assert page.evaluate("document.querySelector('#preview img').naturalWidth") == 64
    shot(page, tmp_path, "artifact-image")

    page.goto(world.url + "/runs/candidate/samples/0/0?file=../../metrics.json")
    assert "Not found" in page.inner_text("h1")


def test_html_in_trajectories_dataset_cells_logs_and_artifact_names_stays_text(
    world: World, page, tmp_path
):
    login(page, world)
    page.goto(world.url + "/runs/candidate/samples/0/0")
    assert XSS in page.inner_text("#trajectory")
    assert XSS_FILE in page.inner_text("#artifacts")
    page.click(f"#artifacts a.file >> text={XSS_FILE}")
    assert page.inner_text("#preview pre") == "payload in a file name"
    no_script_ran(page)

    page.goto(world.url + "/runs/candidate")
    assert XSS in page.inner_text("#logs")
    no_script_ran(page)

    page.goto(world.url + "/datasets")
    shot(page, tmp_path, "datasets")
    page.click("#datasets >> text=math")
    assert XSS in page.inner_text("#preview")
    shot(page, tmp_path, "dataset-preview")
    no_script_ran(page)


def test_compare_page_shows_the_regressed_rows(world: World, page, tmp_path):
    login(page, world)
    page.goto(world.url + "/compare")
    page.select_option("select[data-slot='0']", "base")
    page.select_option("select[data-slot='1']", "candidate")
    follow(page, "#compare-form button[type=submit]")
    assert parse_qs(urlparse(page.url).query)["run"] == ["base", "candidate"]
    candidate = page.inner_text("#summary tr[data-run='candidate']")
    assert "2 regressed" in candidate and "1 improved" in candidate and "3 same" in candidate
    # 6/12 attempts passed in base, 5/12 in candidate, over the six rows scored in both.
    assert re.search(r"-8\.3 pts \(95% CI -\d+\.\d to \+\d+\.\d pts, newcombe paired\)", candidate)
    assert "over 6 rows: 50.0% \u2192 41.7%" in candidate
    shot(page, tmp_path, "compare")

    follow(page, ".tabs >> text=regressed")
    rows = page.locator("#matrix tbody tr").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.row))"
    )
    assert rows == REGRESSED_ROWS


def test_another_workspaces_run_is_not_found_for_every_page(world: World, page, tmp_path):
    login(page, world)
    # Each of these exists for bob (his run has a trajectory and an artifact): only the
    # workspace check can make them 404 for the admin.
    for path in (
        "",
        "/samples",
        "/samples/0/0",
        "/samples/0/0?file=bob.txt",
        "/samples/0/0/artifacts/bob.txt",
        "/files/metrics.json",
        "/files/trajectories/row_0_run_0.json",
    ):
        response = page.goto(world.url + f"/runs/{world.bob_run}{path}")
        assert response.status == 404, path
        assert "not found among your workspaces" in page.inner_text(".error-message"), path
    assert page.goto(world.url + f"/datasets/{world.bob_dataset_id}").status == 404
    assert page.goto(world.url + f"/compare?a={world.bob_run}&b=base").status == 404
    shot(page, tmp_path, "not-found")
    page.goto(world.url + "/compare?a=base&b=" + world.bob_run)
    assert "Not found" in page.inner_text("h1")

    page.context.clear_cookies()
    login(page, world, token=world.bob_token)
    assert run_names(page) == [world.bob_run]  # bob sees his own, and only it
    assert page.goto(world.url + f"/runs/{world.bob_run}").status == 200
    own = world.api(f"/runs/{world.bob_run}/samples/0/0/artifacts/bob.txt", token=world.bob_token)
    assert own.status_code == 200 and own.content == b"bob's own"
    assert page.goto(world.url + f"/datasets/{world.bob_dataset_id}").status == 200


def test_secrets_page_shows_names_and_scopes_never_values(world: World, page, tmp_path):
    import httpx

    value = "sk-live-do-not-show-0000"
    put = httpx.put(
        world.url + "/api/secrets/OPENAI_API_KEY",
        json={"value": value, "scope": "workspace"},
        headers={"Authorization": f"Bearer {world.admin_token}", "X-Osmosis-Git": "acme/evals"},
    )
    assert put.status_code == 200, put.text
    login(page, world)
    page.goto(world.url + "/secrets")
    shot(page, tmp_path, "secrets")
    rows = page.locator("#secrets tbody tr").all_inner_texts()
    assert any("acme/evals" in r and "OPENAI_API_KEY" in r and "workspace" in r for r in rows)
    assert value not in page.content()


def html(world: World, path: str) -> httpx.Response:
    """A page as a script fetches it: the bearer token, asking for HTML."""
    headers = {"Authorization": f"Bearer {world.admin_token}", "Accept": "text/html"}
    return httpx.get(world.url + path, headers=headers, timeout=30)


def test_a_page_past_the_end_says_so_and_links_to_the_last_page(world: World):
    answer = html(world, "/?limit=10&offset=100")  # 31 runs: the last page starts at 30
    assert answer.status_code == 200
    assert "past the end: there are 31" in answer.text
    assert 'rel="prev" href="?limit=10&amp;offset=30"' in answer.text
    assert "No runs on this page." in answer.text
    samples = html(world, "/runs/candidate/samples?offset=50")  # six rows, 25 to a page
    assert "past the end: there are 6" in samples.text
    assert 'rel="prev" href="?"' in samples.text  # one page: back to the first
    attempts = html(world, "/runs/candidate/samples?view=attempts&offset=50")
    assert "past the end: there are 12" in attempts.text


def test_a_malformed_trajectory_still_renders_its_sample_page(world: World, page, tmp_path):
    login(page, world)
    assert page.goto(world.url + "/runs/candidate/samples/1/0").status == 200
    shot(page, tmp_path, "sample-malformed")
    roles = page.locator("#trajectory article").evaluate_all("a => a.map(x => x.dataset.role)")
    assert roles == ["assistant", "unknown", "user"]
    assert '"parts"' in page.locator("#trajectory article").first.inner_text()
    assert page.locator(".tool-call").count() == 0  # "not a list" is no list of calls
    assert page.locator(".call-metrics").count() == 0  # no numbers, nothing to show
    assert page.inner_text("#label") == '{"nested": [1, 2]}'


def test_a_long_trajectory_is_shown_a_page_of_steps_at_a_time(world: World, page, tmp_path):
    login(page, world)
    page.goto(world.url + "/runs/candidate/samples/2/0")
    articles = page.locator("#trajectory article")
    assert articles.count() == STEPS_PER_PAGE
    first = articles.first.locator(".body").inner_text()
    assert first.startswith("x" * 100) and "more characters" in first
    assert len(first) < 25_000  # cut: the JSON download has all of it
    seen = [articles.last.locator(".body").inner_text()]
    while page.locator("#trajectory a[rel=next]").count():
        follow(page, "#trajectory a[rel=next]")
        seen.append(page.locator("#trajectory article").last.locator(".body").inner_text())
    assert seen[-1] == f"this is step {LONG_STEPS}"  # the last step is reachable
    shot(page, tmp_path, "sample-long")
    # Paging keeps the artifact preview, and the preview keeps the page of steps.
    page.goto(world.url + "/runs/candidate/samples/0/0?file=notes/answer.txt&offset=0")
    assert page.inner_text("#preview pre").startswith("the answer is 42")


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/runs/candidate",
        "/runs/candidate/samples",
        "/runs/candidate/samples/0/0?file=notes/answer.txt",
        "/compare?a=base&b=candidate",
        "/datasets",
        "/secrets",
    ],
)
def test_pages_fit_a_narrow_window(world: World, browser, tmp_path, path):
    context = browser.new_context(viewport={"width": 390, "height": 800})
    try:
        page = context.new_page()
        login(page, world)
        page.goto(world.url + path)
        shot(page, tmp_path, "narrow")
        # Nothing but a wide table's own scroller is wider than the window.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        header = page.locator("header.top").bounding_box()
        sign_out = page.locator("header.top button").bounding_box()
        assert sign_out["y"] + sign_out["height"] <= header["y"] + header["height"]
        assert sign_out["x"] + sign_out["width"] <= 390
    finally:
        context.close()


def test_a_filter_no_run_has_still_shows_in_its_menu(world: World):
    answer = html(world, "/?dataset=gone&status=queued")
    assert "No runs match these filters." in answer.text
    assert '<option value="gone" selected>gone</option>' in answer.text
    assert '<option value="queued" selected>queued</option>' in answer.text


def test_forms_have_labels_and_work_from_the_keyboard(world: World, page, tmp_path):
    page.goto(world.url + "/login")
    # Focus starts in the field: `autofocus` applies once the page has loaded, which on a
    # busy machine can be after goto() returns, so wait for it (and fail if it never comes).
    page.wait_for_function("() => document.activeElement?.id === 'token'", timeout=10_000)
    page.keyboard.type(world.admin_token)
    page.keyboard.press("Enter")
    page.wait_for_url(world.url + "/")
    unlabelled = """() => [...document.querySelectorAll('input:not([type=hidden]), select')]
        .filter(e => !e.labels.length).map(e => e.name)"""
    for path in ("/", "/runs/candidate/samples", "/compare?a=base&b=candidate"):
        page.goto(world.url + path)
        assert page.evaluate(unlabelled) == [], path
    # From the keyboard: a letter picks an outcome, Enter in the search box submits the form.
    page.goto(world.url + "/runs/candidate/samples")
    page.focus("select[name=outcome]")
    page.keyboard.press("e")  # "errored"
    page.focus("input[name=q]")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*outcome=errored.*"))
    assert page.locator("#samples tr.attempt").count() == 2
    # The older link for errored attempts still works.
    page.goto(world.url + "/runs/candidate/samples?failed=1")
    assert page.locator("#samples tr.attempt").count() == 2


def test_an_error_page_keeps_the_navigation_and_the_sign_out(world: World, page, tmp_path):
    login(page, world)
    for path, status in (("/runs/nope", 404), ("/runs/base/samples?max_reward=lots", 422)):
        answer = page.goto(world.url + path)
        assert answer is not None and answer.status == status
        assert page.locator("header.top nav a").all_inner_texts() == [
            "Runs",
            "Compare",
            "Datasets",
            "Secrets",
        ]
        assert page.locator("header.top button", has_text="Sign out").count() == 1
    shot(page, tmp_path, "error-page")


def test_a_platform_run_whose_attempts_all_failed_says_so(world: World, page, tmp_path):
    login(page, world)
    badge = page.locator(f"#runs tr[data-run='{ALL_FAILED}'] .status")
    assert badge.inner_text() == "all errored"
    assert badge.get_attribute("data-status") == "finished"  # the run itself did finish
    page.goto(world.url + f"/runs/{ALL_FAILED}")
    assert "Every recorded attempt of this run errored (4 of 4)" in page.inner_text("#all-failed")
    follow(page, "#all-failed >> text=See the errors")
    assert page.locator("#samples tr.attempt").count() == 4
