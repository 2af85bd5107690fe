"""The site seam's small pure parts: its public names, the result parser every RolloutAPI
shares, how a server's capacity and a dead server's cause are read, the restart budget."""

from __future__ import annotations

import pytest

import osmosis.eval.sites as sites
from osmosis.eval.sites import MalformedResponse, parse_result
from osmosis.eval.sites.local import capacity_of
from osmosis.eval.sites.rollout_process import last_error_line
from osmosis.eval.sites.seam import RestartBudget, SiteExhausted


def test_the_public_names_are_pinned():
    assert sites.__all__ == [
        "PROTOCOL_ERROR",
        "AdmissionRejected",
        "AtCapacity",
        "Endpoint",
        "Lease",
        "MalformedResponse",
        "ResultDeadlineExceeded",
        "RolloutAPI",
        "RolloutServerUnavailable",
        "Site",
        "SiteExhausted",
        "parse_result",
    ]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b'{"rollout_id": "a", "status": "finished-ish"}', "status: Input should be"),
        (b'{"status": "success"}', "rollout_id: Field required"),
        (b'{"rollout_id": "a", "status": "success", "sample": {"reward": NaN}}', "sample"),
        (b"[1, 2]", "body: Input should be an object"),
    ],
)
def test_a_result_body_out_of_shape_is_malformed_and_says_why(body, problem):
    with pytest.raises(MalformedResponse) as caught:
        parse_result(body)
    assert str(caught.value).startswith("malformed result body: ")
    assert problem in str(caught.value)


def test_a_result_body_in_shape_parses():
    result = parse_result(b'{"rollout_id": "a", "status": "failure", "err_category": "timeout"}')
    assert (result.status, result.err_category) == ("failure", "timeout")


@pytest.mark.parametrize(
    ("health", "capacity"),
    [
        ({"concurrency": {"max_concurrent": 8}}, 8),
        ({"max_queue_depth": 3}, 3),
        ({"concurrency": {"max_concurrent": 0}}, None),
        ({"concurrency": {"max_concurrent": "8"}}, None),
        ({"status": "ok"}, None),
    ],
)
def test_capacity_comes_from_health(health, capacity):
    assert capacity_of(health) == capacity


@pytest.mark.parametrize(
    ("lines", "cause"),
    [
        (
            ["Traceback (most recent call last):", '  File "main.py", line 3', "KeyError: 'x'"],
            "KeyError: 'x'",
        ),
        (
            ["ValueError: boom", "INFO:     Uvicorn running on http://127.0.0.1:9 (CTRL+C)"],
            "ValueError: boom",
        ),
        (["starting", "fatal: cannot open model file", "bye"], "fatal: cannot open model file"),
        (["INFO:     Uvicorn running on http://127.0.0.1:9", ""], None),
        ([], None),
    ],
)
def test_a_dead_servers_cause_is_its_error_line_not_its_last_line(lines, cause):
    assert last_error_line(lines) == cause


def test_the_restart_budget_counts_within_its_window_per_name():
    now = [0.0]
    budget = RestartBudget(limit=2, window_sec=600, clock=lambda: now[0])
    assert [budget.charge("a"), budget.charge("b")] == [1, 1]
    now[0] = 100.0
    assert budget.charge("a") == 2
    with pytest.raises(SiteExhausted, match=r"a was restarted 2 times in the last 10 minutes"):
        budget.charge("a")  # a crash loop spends it at once
    now[0] = 599.0
    with pytest.raises(SiteExhausted, match=r"\(limit 2\)"):
        budget.charge("a")  # the refused restart counted nothing
    # Ten minutes after the first restart it no longer counts: a long run keeps its replica.
    now[0] = 600.0
    assert budget.charge("a") == 2
    with pytest.raises(SiteExhausted):
        budget.charge("a")  # the one at 100 s still counts
    assert budget.describe(2) == "restart 2 of 2 within 10 minutes"
    with pytest.raises(SiteExhausted, match="restarted 0 times"):
        RestartBudget(limit=0).charge("a")
