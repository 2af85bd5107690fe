# Config files

`configs/eval/<name>.toml` drives both `osmosis eval run` (local) and `osmosis eval submit`
(the platform). Every problem in a file is reported at once, with its line and key.

```toml
[experiment]
rollout = "my-rollout"            # a directory under rollouts/
entrypoint = "main.py"            # a file inside rollouts/<rollout>/
model_path = "openai/gpt-5-mini"  # a LiteLLM model id; "local/smollm2-135m" needs no key
dataset = "my-dataset"            # data/<dataset>.jsonl locally, the uploaded name on the platform
# branch = "my-feature"           # a pushed branch, or:
# commit_sha = "abc1234"          # a pushed commit (default: origin's default branch)

[evaluation]
# limit = 200                     # the first N rows; without it eval run takes every row and
#                                 # the platform a random 10 % sample
# n = 1                           # attempts per row (pass@k when > 1)
# batch_size = 1                  # attempts in flight at once
# pass_threshold = 1.0            # a reward >= this passes
# agent_workflow_timeout_s = 450
# grader_timeout_s = 150

# [env]                           # literal values for the rollout process; never secrets
# LOG_LEVEL = "INFO"

[secrets]
required = []                     # secret names, e.g. ["OPENAI_API_KEY"]; values come from
                                  # --secrets-file, the environment, or `osmosis secret set`
```

`configs/training/<name>.toml` has the same `[experiment]`, with `[training]`, `[sampling]`
and `[checkpoints]` sections.
