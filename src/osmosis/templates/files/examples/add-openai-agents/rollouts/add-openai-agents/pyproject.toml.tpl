[project]
name = "add-openai-agents"
description = "The add example on the OpenAI Agents SDK, for the osmosis-ai rollout SDK."
version = "0.1.0"
requires-python = ">=3.12"
dependencies = [
    "osmosis-ai[server,openai-agents]>=0.3.8,<0.4",
]
