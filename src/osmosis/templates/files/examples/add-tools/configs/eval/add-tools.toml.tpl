# The add-tools agent: `osmosis eval run configs/eval/add-tools.toml`.
# It needs a model that calls tools. Without a key, try the scripted model:
#   osmosis dev fake-model --port 8001 &
#   OPENAI_API_BASE=http://127.0.0.1:8001/v1 OPENAI_API_KEY=unused \
#     osmosis eval run configs/eval/add-tools.toml
[experiment]
rollout = "add-tools"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "add"

[evaluation]
n = 1
batch_size = 4
pass_threshold = 1.0
agent_workflow_timeout_s = 120
grader_timeout_s = 30

[secrets]
required = ["OPENAI_API_KEY"]
