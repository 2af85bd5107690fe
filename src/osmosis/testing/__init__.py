"""A scripted, deterministic OpenAI-compatible model server for tests and benchmarks.

Ship the fake with the real thing: point any OpenAI client, the engine's bridge, or an agent
framework at `server.base_url` and get reproducible answers, tool calls, latency and faults.

    from osmosis.testing import FakeModelServer, Rule, Fail

    with FakeModelServer(script=[Rule(contains="judge", respond='{"score": 1}')]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused")

From a shell: `osmosis dev fake-model --port 0` prints its base URL and serves until stopped.
"""

from osmosis.testing._app import Stats
from osmosis.testing.judge import JudgeScript, candidate_text
from osmosis.testing.script import ChatRequest, Fail, Reply, Rule, ToolCall
from osmosis.testing.server import FakeModelServer

__all__ = [
    "ChatRequest",
    "Fail",
    "FakeModelServer",
    "JudgeScript",
    "Reply",
    "Rule",
    "Stats",
    "ToolCall",
    "candidate_text",
]
