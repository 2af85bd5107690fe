# `<your-rollout>`

Created by `osmosis rollout init`. Edit `main.py`: `Workflow.run()` drives the model,
`ExactAnswer.grade()` scores the result.

```bash
osmosis eval run configs/eval/<your-rollout>.toml      # evaluate on this machine
git push && osmosis eval submit configs/eval/<your-rollout>.toml   # on the platform
```

Rows come from `data/<your-rollout>.jsonl` (`user_prompt`, `ground_truth`, optional
`system_prompt` and `metadata`); change `dataset` in the config to use another. A
`pyproject.toml` here gives the rollout its own environment with the dependencies it lists.
