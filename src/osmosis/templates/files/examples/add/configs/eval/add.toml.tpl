# One-digit sums on the bundled local model: `osmosis eval run configs/eval/add.toml`.
# SmolLM2-135M (no key, no network) gets about half of the attempts right, so the numbers
# move: pass rate, and pass@4 above pass@1. Point model_path at another model to compare.
[experiment]
rollout = "add"
entrypoint = "main.py"
model_path = "local/smollm2-135m"
dataset = "add"

[evaluation]
limit = 24                     # every row; without it the platform samples 10 % (eval run: all)
n = 4                          # attempts per row: pass@1, pass@2 and pass@4
batch_size = 4
pass_threshold = 1.0
agent_workflow_timeout_s = 120
grader_timeout_s = 30

[secrets]
required = []
