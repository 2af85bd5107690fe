"""`osmosis eval view` in Debian's headless chromium, over local runs that `osmosis eval run`
wrote against the scripted model (one config, four variants: see local_world.py). What a
person browsing their local results would see: no login, the run and its samples, search,
a failed attempt's traceback, CSV, previous/next, the all-failed state, three runs compared,
a run followed live, and pages that fit a phone. Screenshots go under each test's tmp_path."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from playwright.sync_api import expect

from osmosis.platform.web.render import number, percent
from osmosis.platform.web.samples_index import CSV_COLUMNS
from tests.web.conftest import LocalWorld, follow, shot
from tests.web.local_world import RUNS, eval_run, metrics

pytestmark = pytest.mark.browser


def attempts_shown(page) -> list[list[int]]:
    return page.locator("#samples tr.attempt").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.row), Number(r.dataset.attempt)])"
    )


def slot(url: str) -> tuple[int, int]:
    row, attempt = urlparse(url).path.rsplit("/", 2)[-2:]
    return int(row), int(attempt)


def test_view_shows_local_runs_without_login_and_a_run_as_its_files_say(
    local_world: LocalWorld, page, tmp_path
):
    page.goto(local_world.url + "/")
    assert urlparse(page.url).path == "/"  # nothing to sign in to
    created = {
        name: json.loads((local_world.run_dir(name) / "manifest.json").read_text())["created_at"]
        for name in RUNS
    }
    names = page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)")
    # Newest first; runs started in the same millisecond go by name, as the view sorts them.
    assert names == sorted(RUNS, key=lambda name: (created[name], name), reverse=True)
    assert page.locator("header.top nav a").all_inner_texts() == ["Runs", "Compare"]
    assert "read-only" in page.inner_text("#view-mode")
    shot(page, tmp_path, "view-runs")

    page.click("#runs >> text=base")
    page.wait_for_url(local_world.url + "/runs/base")
    summary = metrics(local_world.run_dir("base"))["summary"]
    outcomes = summary["outcomes"]
    assert outcomes == {"passed": 7, "not_passed": 3, "errored": 2, "skipped": 0}
    assert page.inner_text("#counts") == (
        f"{summary['graded']} graded · 7 passed, 3 not passed, 2 errored, 0 skipped"
    )
    follow(page, "#counts >> text=3 not passed")  # each count opens its attempts
    assert len(page.locator("#samples tr.attempt [data-outcome=not_passed]").all()) == 3
    page.go_back()
    assert page.inner_text("#pass-rate") == percent(summary["pass_rate"])
    assert page.inner_text("#avg-reward") == number(summary["reward_stats"]["mean"])
    ci = summary["confidence_intervals"]["pass_rate"]
    shown = page.inner_text("#pass-rate-ci")
    assert f"CI {percent(ci['low'])} \u2013 {percent(ci['high'])}" in shown
    assert ci["method"].replace("_", " ") in shown  # each interval names its method
    assert page.inner_text("#pass-at-k") == ", ".join(
        f"{p['k']}: {percent(p['value'])}" for p in summary["pass_at_k"]
    )
    assert page.inner_text("#flaky-rows") == "5"  # 1 of its 2 attempts passed
    assert page.inner_text("#status") == "finished"
    assert page.locator("#stop-form").count() == 0  # nothing here changes a run
    with page.expect_download() as download:
        page.click("#downloads >> text=metrics.json")
    saved = Path(download.value.path()).read_bytes()
    assert saved == (local_world.run_dir("base") / "metrics.json").read_bytes()
    shot(page, tmp_path, "view-run")


def test_samples_show_input_output_and_error_by_row_with_each_rows_pass_at_k(
    local_world: LocalWorld, page, tmp_path
):
    page.goto(local_world.url + "/runs/base/samples")
    groups = page.locator("#samples tbody.row-group")
    assert groups.count() == 6
    first = page.locator("#samples tbody[data-row='0'] .row-head").inner_text()
    assert "2/2 passed" in first and "pass@1 100% · pass@2 100%" in first
    assert "What is 2 * 7? Ask the otter." in first  # the input, from the dataset row
    # Row 5 passed one of its two attempts: pass@1 = 1/2, pass@2 = 1 - C(1,2)/C(2,2) = 1.
    half = page.locator("#samples tbody[data-row='5'] .row-head").inner_text()
    assert "1/2 passed" in half and "pass@1 50% · pass@2 100%" in half
    wrong = page.locator("#samples tbody[data-row='2'] tr.attempt").first.inner_text()
    assert "The answer is 0, said the heron." in wrong  # the final output
    failed = page.locator("#samples tbody[data-row='4'] tr.attempt").all_inner_texts()
    assert len(failed) == 2
    assert all("cannot parse the question: puffin" in line for line in failed)  # the message
    shot(page, tmp_path, "view-samples")

    page.select_option("select[name=view]", "attempts")
    follow(page, "#sample-filters button[type=submit]")
    assert attempts_shown(page) == [[row, k] for row in range(6) for k in range(2)]
    assert "What is 4 * 7? Ask the heron." in page.inner_text("#samples tr.attempt[data-row='2']")


def test_search_finds_a_sample_by_a_word_of_its_output(local_world: LocalWorld, page, tmp_path):
    page.goto(local_world.url + "/runs/candidate/samples")
    # Only candidate's wrong answer (row 0) says this; no input does.
    page.fill("input[name=q]", '"is 0, said"')
    page.press("input[name=q]", "Enter")
    assert parse_qs(urlparse(page.url).query)["q"] == ['"is 0, said"']
    assert attempts_shown(page) == [[0, 0], [0, 1]]
    assert "said the otter" in page.inner_text("#samples")
    assert page.inner_text("#attempt-count").startswith("2 attempts match, of 12 recorded")
    shot(page, tmp_path, "view-search")

    # A word of an error message; then words in any order; then nothing.
    page.goto(local_world.url + "/runs/third/samples?q=cannot+parse")
    assert attempts_shown(page) == [[1, 0], [1, 1]]
    page.goto(local_world.url + "/runs/third/samples?q=FALCON+question")
    assert attempts_shown(page) == [[1, 0], [1, 1]]
    page.goto(local_world.url + "/runs/third/samples?q=zebra")
    assert "No attempts match these filters." in page.inner_text("#samples-live")


def test_a_failed_attempt_shows_its_prompt_and_its_traceback(
    local_world: LocalWorld, page, tmp_path
):
    page.goto(local_world.url + "/runs/base/samples?failed=1")
    follow(page, "#samples tr.attempt >> nth=0 >> a")
    assert slot(page.url) == (4, 0)
    assert page.inner_text("#user-prompt") == "What is 6 * 7? Ask the puffin."
    assert "cannot parse the question: puffin" in page.inner_text("#error-message")
    traceback = page.inner_text("#traceback")
    assert traceback.startswith("Traceback (most recent call last):")
    assert re.search(r'main\.py", line \d+, in parse', traceback)  # the rollout's own frame
    assert traceback.rstrip().endswith("ValueError: cannot parse the question: puffin")
    assert "From logs.txt" in page.inner_text("#error")
    shot(page, tmp_path, "view-failed-sample")


def test_previous_and_next_walk_the_list_they_came_from(local_world: LocalWorld, page):
    page.goto(local_world.url + "/runs/broken/samples?failed=1&view=attempts")
    listed = attempts_shown(page)
    assert len(listed) == 12
    follow(page, "#samples tr.attempt >> nth=0 >> a")
    assert page.locator("#sample-nav a[rel=prev]").count() == 0
    assert page.inner_text("#sample-nav .where") == "1 of 12 matching"
    walked = [list(slot(page.url))]
    while page.locator("#sample-nav a[rel=next]").count():
        follow(page, "#sample-nav a[rel=next]")
        query = parse_qs(urlparse(page.url).query)
        assert query["failed"] == ["1"] and query["view"] == ["attempts"]  # the list travels
        walked.append(list(slot(page.url)))
    assert walked == listed
    follow(page, "#sample-nav a[rel=prev]")
    assert list(slot(page.url)) == listed[-2]
    page.click(".crumbs >> text=Samples")  # back to the same list
    assert parse_qs(urlparse(page.url).query) == {"failed": ["1"], "view": ["attempts"]}

    # Within a search, the neighbours are the search's.
    page.goto(local_world.url + "/runs/candidate/samples/2/0?q=heron")
    assert page.locator("#sample-nav a[rel=prev]").count() == 0
    assert slot(page.locator("#sample-nav a[rel=next]").get_attribute("href") or "") == (2, 1)


def test_csv_export_holds_the_filtered_table(local_world: LocalWorld, page, tmp_path):
    page.goto(local_world.url + '/runs/candidate/samples?q="is 0, said"')
    with page.expect_download() as download:
        page.click("#csv")
    assert download.value.suggested_filename == "candidate-samples.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert [(r["row_index"], r["run_index"]) for r in rows] == [("0", "0"), ("0", "1")]
    assert rows[0]["input"] == "What is 2 * 7? Ask the otter."
    assert rows[0]["expected"] == "14"  # the row's ground truth, beside what was answered
    assert rows[0]["output"] == "The answer is 0, said the otter."
    # The list shows it too: on the row's heading (by row) or in its own column (flat).
    shown = page.locator(
        "#samples [data-row='0'] .row-expected, #samples [data-row='0'] td.expected"
    )
    assert shown.first.inner_text().strip().removeprefix("expected: ") == "14"
    assert (rows[0]["status"], rows[0]["reward"]) == ("success", "0.0")

    everything = httpx.get(local_world.url + "/runs/base/samples.csv?failed=1", timeout=30)
    table = list(csv.reader(io.StringIO(everything.text)))
    assert table[0] == list(CSV_COLUMNS)
    assert [(r[0], r[1], r[6]) for r in table[1:]] == [
        ("4", "0", "validation_error"),
        ("4", "1", "validation_error"),
    ]
    assert all("cannot parse the question: puffin" in r[7] for r in table[1:])


def test_a_run_whose_attempts_all_failed_is_not_a_green_finished(
    local_world: LocalWorld, page, tmp_path
):
    assert metrics(local_world.run_dir("broken"))["eval_run"]["status"] == "finished"
    page.goto(local_world.url + "/")
    broken = page.locator("#runs tr[data-run='broken'] .status")
    finished = page.locator("#runs tr[data-run='base'] .status")
    assert broken.inner_text() == "all errored" and finished.inner_text() == "finished"
    style = "e => [getComputedStyle(e).color, getComputedStyle(e).borderStyle]"
    assert broken.evaluate(style) != finished.evaluate(style)
    assert broken.evaluate(style)[0] == "rgb(179, 38, 30)"  # the dashboard's red, --bad
    page.goto(local_world.url + "/runs/broken")
    banner = page.inner_text("#all-failed")
    assert "Every recorded attempt of this run errored (12 of 12)" in banner
    assert "validation_error" in banner
    assert page.inner_text("#status") == "all errored"
    shot(page, tmp_path, "view-all-failed")


# Rows against the baseline, by hand from local_world.BEHAVIOURS: candidate, third.
KINDS = {
    0: ["regressed", "same"],
    1: ["same", "regressed"],
    2: ["improved", "improved"],
    3: ["same", "same"],
    4: ["improved", "improved"],
    5: ["improved", "improved"],
}


def test_compare_of_three_runs_renders_the_matrix(local_world: LocalWorld, page, tmp_path):
    page.goto(local_world.url + "/compare")
    page.select_option("select[data-slot='0']", "base")
    page.select_option("select[data-slot='1']", "candidate")
    follow(page, "#compare-form button[type=submit]")
    page.select_option("select[data-slot='2']", "third")  # a menu for one more run
    follow(page, "#compare-form button[type=submit]")
    assert parse_qs(urlparse(page.url).query)["run"] == ["base", "candidate", "third"]
    heads = page.locator("#matrix thead th").all_inner_texts()
    assert heads[1:6] == ["Input", "Expected", "base baseline", "candidate", "third"]

    follow(page, ".tabs a[data-show=all]")
    kinds = page.locator("#matrix tbody tr").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.row), r.dataset.kinds.split(' ')])"
    )
    assert kinds == [[row, expected] for row, expected in KINDS.items()]
    cells = page.locator("#matrix tbody tr[data-row='1'] td.num").all_inner_texts()
    assert cells == ["2/2", "2/2", "0/2 · 2 err"]  # passes/attempts per run, and errors
    # Each row says what was asked and expected; a row whose attempts disagree is flaky.
    row0 = page.locator("#matrix tbody tr[data-row='0']")
    assert row0.locator("td.input").inner_text() == "What is 2 * 7? Ask the otter."
    assert row0.locator("td.expected").inner_text() == "14"
    half = page.locator("#matrix tbody tr[data-row='5'] td.num").all_inner_texts()
    assert half[0] == "1/2 flaky" and "flaky" not in half[1]
    third = page.inner_text("#summary tr[data-run='third']")
    assert "1 regressed, 3 improved, 2 same, 0 missing" in third
    assert "newcombe paired" in third  # few rows: the interval method says so
    follow(page, ".tabs a[data-show=regressed]")
    rows = page.locator("#matrix tbody tr").evaluate_all("r => r.map(x => Number(x.dataset.row))")
    assert rows == [0, 1]
    shot(page, tmp_path, "view-compare")

    follow(page, "#matrix tr[data-row='0'] >> text=side by side")
    columns = page.locator("#side-by-side .column")
    assert columns.evaluate_all("cs => cs.map(c => [c.dataset.run, c.dataset.kind])") == [
        ["base", "baseline"],
        ["candidate", "regressed"],
        ["third", "same"],
    ]
    assert "said the otter" in columns.nth(1).inner_text()
    assert "The answer is 0" in columns.nth(1).inner_text()
    assert "The answer is 14" in columns.nth(0).inner_text()
    assert page.inner_text("#user-prompt") == "What is 2 * 7? Ask the otter."
    assert page.inner_text("#expected") == "14"
    shot(page, tmp_path, "view-compare-row")


def test_an_unknown_run_is_a_not_found_page_that_keeps_the_navigation(
    local_world: LocalWorld, page
):
    answer = page.goto(local_world.url + "/runs/nope/samples")
    assert answer is not None and answer.status == 404
    assert "no local run 'nope'" in page.inner_text(".error-message")
    assert page.locator("header.top nav a").all_inner_texts() == ["Runs", "Compare"]
    answer = page.goto(local_world.url + "/runs/base/samples?min_reward=lots")
    assert answer is not None and answer.status == 422
    assert page.locator("header.top nav a").count() == 2


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/runs/base",
        "/runs/base/samples",
        "/runs/base/samples?view=attempts",
        "/runs/base/samples/4/0",
        "/compare?run=base&run=candidate&run=third&show=all",
        "/compare/rows/1?run=base&run=candidate&run=third",
        "/runs/nope",
    ],
)
def test_view_pages_fit_a_narrow_window(local_world: LocalWorld, browser, tmp_path, path):
    context = browser.new_context(viewport={"width": 390, "height": 800})
    try:
        page = context.new_page()
        page.goto(local_world.url + path)
        shot(page, tmp_path, "narrow")
        # Nothing but a wide table's own scroller is wider than the window.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        context.close()


@pytest.mark.slow
def test_a_run_still_going_is_shown_live(local_world: LocalWorld, page, tmp_path):
    """Last in this module: it adds a run to the directory the other tests list."""
    process = eval_run(local_world.config, "live", "a", local_world.env, wait=False, SLEEP="0.4")
    try:
        expect_status = expect(page.locator("#status"))
        for _ in range(200):  # the directory appears once `eval run` has opened it
            answer = page.goto(local_world.url + "/runs/live")
            if (
                answer is not None
                and answer.status == 200
                and "running" in page.inner_text("#status")
            ):
                break
            page.wait_for_timeout(100)
        expect_status.to_have_text("running")
        first = page.inner_text("#progress")
        # No reload by hand: the page refreshes itself while the run goes on, then stops.
        expect(page.locator("#progress")).not_to_have_text(first, timeout=30_000)
        expect_status.to_have_text("finished", timeout=90_000)
        assert page.inner_text("#progress").startswith("12/12 samples")
        summary = metrics(local_world.run_dir("live"))["summary"]
        assert page.inner_text("#pass-rate") == percent(summary["pass_rate"])
        shot(page, tmp_path, "view-live-finished")
    finally:
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output


def test_the_samples_list_filters_each_outcome(local_world: LocalWorld, page, tmp_path):
    # base: rows 0, 1 and 3 right twice, row 2 wrong twice, row 4 crashes, row 5 half right.
    expected = {"passed": 7, "not_passed": 3, "errored": 2, "skipped": 0}
    page.goto(local_world.url + "/runs/base/samples?view=attempts")
    badges = page.locator("#samples tr.attempt [data-outcome]")
    shown = [badges.nth(i).get_attribute("data-outcome") for i in range(badges.count())]
    assert {name: shown.count(name) for name in expected} == expected
    for name, count in expected.items():
        page.goto(local_world.url + "/runs/base/samples?view=attempts")
        page.select_option("select[name=outcome]", name)
        follow(page, "#sample-filters button[type=submit]")
        assert parse_qs(urlparse(page.url).query)["outcome"] == [name]
        labels = page.locator("#samples tr.attempt [data-outcome]").all_inner_texts()
        assert len(labels) == count, name
        assert set(labels) <= {name.replace("_", " ")}
    shot(page, tmp_path, "view-errored-only")
    rows = list(
        csv.DictReader(
            io.StringIO(httpx.get(local_world.url + "/runs/base/samples.csv", timeout=30).text)
        )
    )
    assert {name: [r["outcome"] for r in rows].count(name) for name in expected} == expected
