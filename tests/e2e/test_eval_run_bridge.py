"""`osmosis eval run` with a rollout that calls the model under rollout ids the run never gave
out (issue 25, point 8): refused, counted where the run reports, and the run's token total is
what the provider served."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

STRAYS = 5
STRAYING_MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    f"""        reply = await ctx.chat(ctx.prompt)
        import httpx
        from osmosis import get_rollout_context
        rollout = get_rollout_context()
        base = rollout.chat_completions_url.rstrip("/").rsplit("/", 1)[0]
        async with httpx.AsyncClient(timeout=10) as client:
            for index in range({STRAYS}):
                stray = await client.post(
                    f"{{base}}/stray-{{index}}-{{rollout.rollout_id}}/chat/completions",
                    json={{"messages": ctx.prompt, "max_tokens": 50}},
                    headers={{"authorization": f"Bearer {{rollout.api_key}}"}},
                )
                print("stray call answered", stray.status_code, flush=True)
""",
)


def test_calls_under_invented_ids_are_refused_counted_and_the_tokens_are_what_was_served(
    tmp_path: Path, fake_model
) -> None:
    assert STRAYING_MAIN != SCRIPTED_MAIN
    # The run's pre-flight asks the provider once too (not an attempt's call): learn its cost
    # from the same request, so what is left is what the attempts were served.
    probe = httpx.post(
        fake_model.base_url + "/chat/completions",
        json={
            "model": "fake-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 32,
        },
    ).json()["usage"]
    fake_model.reset()
    rows = [row("pass", a, 3) for a in range(2, 12)]  # 10 attempts, 50 stray calls
    config = make_workspace(tmp_path, rows, main=STRAYING_MAIN)
    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "strays",
        "-y",
        cwd=tmp_path,
        env=model_env(fake_model),
    )
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / ".osmosis" / "evals" / "strays"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    served = fake_model.stats()
    # The pre-flight and one call per attempt: the stray calls never reached the provider.
    assert served.chat_completions == 1 + len(rows)
    tokens = served.prompt_tokens + served.completion_tokens - probe["total_tokens"]
    assert metrics["summary"]["tokens_used"] == tokens
    assert metrics["eval_run"]["bridge"]["refused_calls"] == STRAYS * len(rows)
    log = (run_dir / "logs.txt").read_text()
    assert f"model bridge: refused {STRAYS * len(rows)} calls under rollout ids" in log
