# The OpenAI Agents SDK example: `osmosis eval run configs/eval/add-openai-agents.toml`.
# Its environment is built from rollouts/add-openai-agents/pyproject.toml (osmosis-ai and
# openai-agents from the package index, Python >= 3.12 from this machine). It needs a model
# that calls tools; see configs/eval/add-tools.toml for the scripted model without a key.
[experiment]
rollout = "add-openai-agents"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "add"

[evaluation]
n = 1
batch_size = 4
pass_threshold = 1.0
agent_workflow_timeout_s = 180
grader_timeout_s = 30

[secrets]
required = ["OPENAI_API_KEY"]
