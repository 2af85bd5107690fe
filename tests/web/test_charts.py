"""The server-side SVG charts: bins hold every reward once, points sit where pass@k says."""

from __future__ import annotations

import re

import pytest

from osmosis.platform.web.charts import histogram, pass_at_k_svg, reward_histogram_svg


@pytest.mark.parametrize(
    ("rewards", "counts"),
    [
        ([0.0, 0.0, 1.0], [2, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        ([0.5, 0.5], [2]),  # all equal: one bin
        ([0.0, 0.25, 0.5, 0.75, 1.0], [1, 0, 1, 0, 0, 1, 0, 1, 0, 1]),
        ([], []),
        ([float("nan"), 1.0], [1]),  # not a number is no reward
    ],
)
def test_histogram_puts_every_reward_in_exactly_one_bin(rewards, counts):
    bins = histogram(rewards)
    assert [b.count for b in bins] == counts
    if bins:
        assert bins[0].low == min(r for r in rewards if r == r)
        assert bins[-1].high == max(r for r in rewards if r == r)


def test_histogram_svg_draws_one_bar_per_bin_with_its_count():
    svg = str(reward_histogram_svg(histogram([0.0, 1.0, 1.0, 1.0])))
    assert svg.startswith("<svg") and "<script" not in svg
    assert [int(c) for c in re.findall(r'class="bar"[^>]*data-count="(\d+)"', svg)] == [
        1,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        3,
    ]
    assert "no graded attempts yet" in str(reward_histogram_svg([]))


def test_pass_at_k_svg_places_points_by_value_and_escapes_labels():
    svg = str(pass_at_k_svg([{"k": 2, "value": 0.75}, {"k": 1, "value": 0.5}]))
    points = re.findall(r'data-k="(\d+)" data-value="([\d.]+)"', svg)
    assert points == [("1", "0.500000"), ("2", "0.750000")]  # sorted by k
    ys = [float(y) for y in re.findall(r'<circle class="point" cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert ys[0] > ys[1]  # a higher pass@k is drawn higher up
    assert "pass@k needs n ≥ 2" in str(pass_at_k_svg([]))  # n = 1: no curve, and why


@pytest.mark.parametrize("tallest", [1, 3, 5, 7, 10, 13, 101])
def test_histogram_tick_labels_sit_at_the_height_of_their_count(tallest):
    svg = str(reward_histogram_svg(histogram([0.0] * tallest + [1.0] * 4)))
    bottom = float(re.search(r'<line x1="\d+" y1="\d+" x2="\d+" y2="([\d.]+)"', svg).group(1))
    (top_of_bar,) = [
        float(y)
        for y, count in re.findall(r'class="bar"[^>]*y="([\d.]+)"[^>]*data-count="(\d+)"', svg)
        if int(count) == tallest
    ]
    ticks = {
        int(label): float(y) - 4  # the label is drawn 4 px below its grid line
        for y, label in re.findall(
            r'<text x="\d+" y="([\d.]+)" text-anchor="end">(\d+)</text>', svg
        )
    }
    assert len(ticks) <= 5 and 0 in ticks and max(ticks) >= tallest
    per_count = (bottom - ticks[max(ticks)]) / max(ticks)
    for count, y in ticks.items():
        assert y == pytest.approx(bottom - count * per_count, abs=0.11)
    assert top_of_bar == pytest.approx(bottom - tallest * per_count, abs=0.11)


def test_all_equal_rewards_make_one_bar_labelled_once():
    svg = str(reward_histogram_svg(histogram([0.5, 0.5, 0.5])))
    assert re.findall(r'data-count="(\d+)"', svg) == ["3"]
    assert re.findall(r'text-anchor="middle">(0\.5)</text>', svg) == ["0.5"]
