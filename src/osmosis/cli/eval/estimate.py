"""`osmosis eval run --estimate` and the estimate line of `eval submit`'s confirmation.

    osmosis eval run configs/eval/smoke.toml --estimate          # a table; nothing runs
    osmosis eval run configs/eval/smoke.toml --estimate --json   # {"data": {...}}

The figures come from `osmosis.eval.model.estimate` (an earlier run of the rollout, else the
dataset's prompt sizes on a stated assumption).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.eval.host.plan import RunPlan
    from osmosis.eval.inputs.config import EvalConfig
    from osmosis.eval.model.estimate import Estimate, Figure


def _count(figure: Figure) -> str:
    if round(figure.low) == round(figure.high):
        return f"{figure.expected:,.0f}"
    return f"{figure.expected:,.0f} (range {figure.low:,.0f}-{figure.high:,.0f})"


def _dollars(figure: Figure | None) -> str:
    if figure is None:
        return "unknown (no price for this model: set input_usd_per_mtok and output_usd_per_mtok)"
    if round(figure.low, 4) == round(figure.high, 4):
        return f"${figure.expected:,.4f}"
    return f"${figure.expected:,.4f} (range ${figure.low:,.4f}-${figure.high:,.4f})"


def summary_line(estimate: Estimate) -> str:
    """One line for a confirmation: `~12,000 tokens (range …), ~40 model calls, ~$0.0123`."""
    line = f"~{_count(estimate.tokens)} tokens, ~{_count(estimate.calls)} model calls"
    if estimate.cost_usd is not None:
        line += f", ~{_dollars(estimate.cost_usd)}"
    return line + f" ({estimate.basis})"


def show_estimate(out: Output, plan: RunPlan) -> None:
    """Print the pre-run estimate of `plan`: a table, tab-separated lines or `{data}`."""
    from osmosis.eval.model.estimate import estimate_run

    estimate = estimate_run(plan)
    if out.mode.value == "json":
        out.detail({"run_name": plan.name, **estimate.as_dict()})
        return
    out.detail(
        {
            "Model": estimate.model,
            "Attempts": f"{estimate.attempts:,}",
            "Model Calls": _count(estimate.calls),
            "Tokens": _count(estimate.tokens),
            "Cost": _dollars(estimate.cost_usd),
            "Per Attempt": f"{_count(estimate.calls_per_attempt)} calls, "
            f"{_count(estimate.tokens_per_attempt)} tokens",
            "Based On": estimate.source,
            **({"Price": estimate.price_source} if estimate.price_source else {}),
        },
        title=f"Estimate for {plan.name} (nothing was run)",
    )


def submit_estimate(
    workspace: Path, config: EvalConfig, *, rows: int, runs_root: Path
) -> str | None:
    """The estimate line of `eval submit`'s confirmation for `rows` rows of `config`: from a
    local run of the rollout under `runs_root`, else from the workspace's copy of the dataset
    (`data/<dataset>.*`, its first `rows` rows); None when there is neither."""
    from itertools import islice

    from osmosis.eval.inputs.dataset import read_rows
    from osmosis.eval.inputs.dataset_checks import DatasetError
    from osmosis.eval.inputs.dataset_formats import DATASET_SUFFIXES
    from osmosis.eval.model.estimate import SpendQuestion, estimate_spend, prompt_tokens

    name = config.experiment.dataset
    local = [workspace / "data" / f"{name}{suffix}" for suffix in DATASET_SUFFIXES]
    found = [path for path in local if path.is_file()]

    def prompts() -> float:
        try:
            return prompt_tokens(row.messages for row in islice(read_rows(found[0]), rows))
        except (DatasetError, OSError):
            return 0.0  # the platform validated its copy; this one only sizes prompts

    evaluation = config.evaluation
    estimate = estimate_spend(
        SpendQuestion(
            rollout=config.experiment.rollout,
            model=config.experiment.model_path,
            attempts=rows * evaluation.n,
            runs_root=runs_root,
            prompt_tokens=prompts if len(found) == 1 else None,
            input_usd_per_mtok=evaluation.input_usd_per_mtok,
            output_usd_per_mtok=evaluation.output_usd_per_mtok,
        )
    )
    return summary_line(estimate) if estimate is not None else None
