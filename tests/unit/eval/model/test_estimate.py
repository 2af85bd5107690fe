"""The pre-run estimate's arithmetic (issue 28, part 1): which earlier run it learns from, the
range it states, and no cost without a price. Run directories are written as the engine
writes them (manifest.json, events.jsonl, metrics.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osmosis.eval.model.estimate import SpendQuestion, estimate_spend, prompt_tokens


def _run(root: Path, name: str, *, rollout: str, model: str, created: str, tokens: list[int],
         calls: int) -> None:  # fmt: skip
    directory = root / name
    directory.mkdir(parents=True)
    manifest = {
        "created_at": created,
        "inputs": {"model_path": model, "rollout": {"name": rollout}},
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    records = [
        {"row_index": i, "run_index": 0, "status": "success", "tokens": t,
         "prompt_tokens": t // 2, "completion_tokens": t - t // 2}
        for i, t in enumerate(tokens)
    ]  # fmt: skip
    (directory / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    metrics = {"eval_run": {"bridge": {"spent_calls": calls}}}
    (directory / "metrics.json").write_text(json.dumps(metrics))


def _question(root: Path, **changes: object) -> SpendQuestion:
    values: dict = {
        "rollout": "agent",
        "model": "openai/fake-model",
        "attempts": 100,
        "runs_root": root,
        "prompt_tokens": None,
    }
    values.update(changes)
    return SpendQuestion(**values)


def test_the_newest_run_of_the_rollout_and_model_is_the_basis(tmp_path: Path) -> None:
    tokens = list(range(100, 1100, 100))  # 100 … 1000: mean 550
    _run(tmp_path, "older", rollout="agent", model="openai/fake-model", created="2026-01-01",
         tokens=[9999] * 4, calls=4)  # fmt: skip
    _run(tmp_path, "newer", rollout="agent", model="openai/fake-model", created="2026-02-01",
         tokens=tokens, calls=30)  # fmt: skip
    _run(tmp_path, "other-model", rollout="agent", model="openai/other", created="2026-03-01",
         tokens=[1] * 4, calls=4)  # fmt: skip
    _run(tmp_path, "other-rollout", rollout="other", model="openai/fake-model",
         created="2026-04-01", tokens=[1] * 4, calls=4)  # fmt: skip
    estimate = estimate_spend(_question(tmp_path, input_usd_per_mtok=1.0, output_usd_per_mtok=3.0))
    assert estimate is not None
    assert (estimate.basis, estimate.source) == (
        "history",
        "earlier run newer (10 attempts recorded)",
    )
    assert estimate.calls.expected == pytest.approx(300)  # 3 calls an attempt, 100 attempts
    assert estimate.tokens.expected == pytest.approx(55_000)
    assert estimate.tokens.low == pytest.approx(100 * 190)  # 10th percentile: 190
    assert estimate.tokens.high == pytest.approx(100 * 910)  # 90th percentile: 910
    # Half prompt at $1/M, half completion at $3/M: $2 per million tokens.
    assert estimate.cost_usd is not None
    assert estimate.cost_usd.expected == pytest.approx(55_000 * 2 / 1e6)


def test_without_an_earlier_run_the_prompts_and_a_stated_assumption_say(tmp_path: Path) -> None:
    assert estimate_spend(_question(tmp_path)) is None  # neither: no estimate at all
    rows = [[{"role": "user", "content": "x" * 40}], [{"role": "user", "content": "x" * 80}]]
    mean = prompt_tokens(rows)
    assert mean == pytest.approx((10 + 4 + 20 + 4) / 2)  # 4 characters a token, 4 per message
    estimate = estimate_spend(_question(tmp_path, attempts=10, prompt_tokens=lambda: mean))
    assert estimate is not None and estimate.basis == "dataset"
    assert "assumed 1 model call per attempt (range 1-4)" in estimate.source
    assert estimate.tokens.expected == pytest.approx(10 * (mean + 512))
    assert estimate.tokens.low == pytest.approx(10 * (mean + 128))
    assert estimate.tokens.high == pytest.approx(10 * 4 * (mean + 2048))
    assert estimate.cost_usd is None and estimate.price_source is None  # fake-model: no price
