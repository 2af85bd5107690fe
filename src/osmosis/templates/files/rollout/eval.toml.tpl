# Evaluate <your-rollout>: `osmosis eval run configs/eval/<your-rollout>.toml` (this machine)
# or `osmosis eval submit configs/eval/<your-rollout>.toml` (the platform, pushed code).
[experiment]
rollout = "<your-rollout>"          # directory under rollouts/
entrypoint = "main.py"              # file inside rollouts/<your-rollout>/
model_path = "local/smollm2-135m"   # a LiteLLM id, e.g. "openai/gpt-5-mini" (then add its key
                                    # to [secrets] below); local/smollm2-135m needs no key
dataset = "<your-rollout>"          # data/<your-rollout>.jsonl here; the uploaded name on the platform
# branch = "my-feature"             # a pushed branch (mutually exclusive with commit_sha)
# commit_sha = "abc1234"            # a pushed commit; default: origin's default branch

[evaluation]
# Omit a value to use the default.
# limit = 200                       # the first N rows (default: every row locally, a random
#                                   # 10 % sample on the platform)
# n = 1                             # attempts per row (pass@k when > 1)
# batch_size = 1                    # attempts in flight at once
# pass_threshold = 1.0              # a reward >= this passes
# agent_workflow_timeout_s = 450    # per attempt, from submission
# grader_timeout_s = 150

# [env]
# Literal values for the rollout process, visible in git and in logs: never secrets.
# LOG_LEVEL = "INFO"

[secrets]
# Secret names the rollout needs, e.g. ["OPENAI_API_KEY"]; values come from --secrets-file,
# the environment, or `osmosis secret set NAME` on the platform. [] when none.
required = []
