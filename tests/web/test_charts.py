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
    assert "no rewards yet" in str(reward_histogram_svg([]))


def test_pass_at_k_svg_places_points_by_value_and_escapes_labels():
    svg = str(pass_at_k_svg([{"k": 2, "value": 0.75}, {"k": 1, "value": 0.5}]))
    points = re.findall(r'data-k="(\d+)" data-value="([\d.]+)"', svg)
    assert points == [("1", "0.500000"), ("2", "0.750000")]  # sorted by k
    ys = [float(y) for y in re.findall(r'<circle class="point" cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert ys[0] > ys[1]  # a higher pass@k is drawn higher up
    assert "needs n" in str(pass_at_k_svg([]))
