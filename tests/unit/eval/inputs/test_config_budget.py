"""The budget keys of `[evaluation]` (issue 28): typed when valid, every problem named."""

from __future__ import annotations

import pytest

from osmosis.eval.inputs.config import ConfigError, parse_eval_config
from tests.unit.eval.inputs.test_config import with_evaluation


def test_budget_and_price_keys_are_read() -> None:
    config = parse_eval_config(
        with_evaluation(
            "max_tokens_total = 200000\nmax_cost_usd = 5\nmax_model_calls = 40\n"
            "input_usd_per_mtok = 0.15\noutput_usd_per_mtok = 0.6"
        )
    )
    evaluation = config.evaluation
    assert evaluation.max_tokens_total == 200_000
    assert evaluation.max_cost_usd == 5.0
    assert evaluation.max_model_calls == 40
    assert (evaluation.input_usd_per_mtok, evaluation.output_usd_per_mtok) == (0.15, 0.6)


def test_no_budget_by_default() -> None:
    evaluation = parse_eval_config(with_evaluation("n = 1")).evaluation
    assert evaluation.max_tokens_total is None
    assert evaluation.max_cost_usd is None
    assert evaluation.max_model_calls is None
    assert evaluation.input_usd_per_mtok is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("max_tokens_total = 0", "x.toml:11: evaluation.max_tokens_total: must be an integer >= 1"),
        ("max_model_calls = 2.5", "evaluation.max_model_calls: must be an integer >= 1, got 2.5"),
        ("max_cost_usd = 0", "evaluation.max_cost_usd: must be a positive finite number"),
        ("max_cost_usd = nan", "evaluation.max_cost_usd: must be a positive finite number"),
        ("input_usd_per_mtok = -1", "evaluation.input_usd_per_mtok: must be a finite number"),
        ("input_usd_per_mtok = 1", "input_usd_per_mtok: a price override needs output_usd"),
    ],
)
def test_bad_budget_keys_are_named(body: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_eval_config(with_evaluation(body), path="x.toml")
    assert expected in str(raised.value)
