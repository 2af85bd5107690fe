# Working in this osmosis workspace

This repository is an osmosis workspace: rollouts (an agent and its grader) that are
evaluated against a model, row by row, over a dataset.

## Layout

- `rollouts/<name>/` — one rollout: an entrypoint (`main.py`) that serves an `AgentWorkflow`
  and a `Grader` over the rollout protocol, and optionally its own `pyproject.toml`.
- `configs/eval/<name>.toml` — what to evaluate: `[experiment]` (rollout, entrypoint,
  model_path, dataset), `[evaluation]` (limit, n, batch_size, pass_threshold, timeouts),
  `[env]`, `[secrets]`. See `configs/AGENTS.md`.
- `configs/training/<name>.toml` — training configs (the same `[experiment]`).
- `data/<dataset>.jsonl|csv|parquet` — rows with `user_prompt`, optional `system_prompt`,
  `ground_truth` (or `label`) and `metadata`.

## Commands

```bash
osmosis doctor                                  # is the layout complete?
osmosis dataset validate data/<dataset>.jsonl   # every problem, with line and column
osmosis eval run configs/eval/<name>.toml       # evaluate locally; results in .osmosis/evals/
osmosis rollout init <name>                     # a new rollout with its configs
osmosis template list                           # worked examples to start from
```

## Rules

- Never put secret values in a config: `[env]` holds literal values that end up in git and in
  logs. Name secrets in `[secrets].required` and pass them with `--secrets-file` or the
  environment.
- The workflow never sees the label; the grader must call `ctx.set_reward(x)` with a finite
  number (or set `ctx.sample.remove_sample = True` to skip the attempt).
- `.osmosis/` and virtual environments stay out of git (see `.gitignore`).
- The platform runs the pushed commit: commit and push rollout changes before `eval submit`.
