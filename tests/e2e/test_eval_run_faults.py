"""`osmosis eval run` under faults that are not the rollout's: a model provider that stops
answering (SIGSTOP of a real `osmosis dev fake-model` process), an entrypoint that raises at
import, a rollout server that garbles one result, Ctrl-C while the environment builds. What
a user must see: nothing recorded as failed that was not, exit codes as documented (0 done,
1 error or incomplete, 130 interrupted), and a resume that finishes the run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, model_env, osmosis, read_jsonl
from tests.e2e.workspace import (
    OSMOSIS_AI_MAIN,
    OSMOSIS_AI_PYPROJECT,
    SCRIPTED_MAIN,
    make_workspace,
    row,
)

pytestmark = pytest.mark.slow


def run_dir(workspace: Path, name: str) -> Path:
    return workspace / ".osmosis" / "evals" / name


# -- a provider that stops answering --------------------------------------------------------
class ModelProcess:
    """`osmosis dev fake-model` in its own process, so it can be stopped and continued."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [*CLI, "dev", "fake-model", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().strip()
        assert self.base_url.startswith("http://127.0.0.1:"), self.base_url

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "OPENAI_"))}
        return {**env, "OPENAI_API_BASE": self.base_url, "OPENAI_API_KEY": "sk-test", **extra}

    def stop(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def go_on(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.go_on()
        self.process.kill()
        self.process.communicate(timeout=10)


@pytest.fixture
def model_process() -> Iterator[ModelProcess]:
    model = ModelProcess("--latency", "0.05")
    try:
        yield model
    finally:
        model.close()


def start_run(workspace: Path, config: Path, name: str, env: dict[str, str], *flags: str):
    return subprocess.Popen(
        [*CLI, "eval", "run", str(config), "--name", name, "-y", "--json", *flags],
        cwd=workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_records(journal: Path, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not (journal.exists() and len(journal.read_bytes().splitlines()) >= count):
        assert time.monotonic() < deadline and process.poll() is None, "run never got going"
        time.sleep(0.02)


STALL_ROWS = [row("pass", a, 3, sleep=0.05) for a in range(2, 202)]
FOUR = [row("pass", a, 3) for a in range(2, 6)]  # a dataset has at least 4 rows


def test_a_provider_stall_fails_nothing_and_the_run_finishes_by_itself(tmp_path, model_process):
    # The agent's deadline (3 s) is shorter than the time it takes to declare the stall
    # (2 s of silence + a 2 s probe): attempts time out while their model call hangs, and
    # must still not be recorded as `timeout`.
    config = make_workspace(tmp_path, STALL_ROWS, limit=200, batch_size=8, agent_timeout=3)
    env = model_process.env(MAX_CONCURRENT="8")
    process = start_run(tmp_path, config, "stall", env, "--stall-after", "2")
    journal = run_dir(tmp_path, "stall") / "events.jsonl"
    wait_for_records(journal, 20, process)  # 10 %
    model_process.stop()
    time.sleep(8)
    model_process.go_on()
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    metrics = json.loads(out)["resource"]["metrics"]
    assert (metrics["total_samples"], metrics["failed"], metrics["passed"]) == (200, 0, 200)
    keys = sorted((e["row_index"], e["run_index"]) for e in read_jsonl(journal))
    assert keys == [(r, 0) for r in range(200)]
    log = (run_dir(tmp_path, "stall") / "logs.txt").read_text()
    assert "model provider outage" in log and "dispatch resumes" in log


def test_a_stall_longer_than_the_outage_wait_halts_resumable(tmp_path, model_process):
    config = make_workspace(tmp_path, STALL_ROWS, limit=200, batch_size=8, agent_timeout=3)
    env = model_process.env(MAX_CONCURRENT="8")
    flags = ("--stall-after", "1", "--outage-wait", "3")
    process = start_run(tmp_path, config, "long", env, *flags)
    journal = run_dir(tmp_path, "long") / "events.jsonl"
    wait_for_records(journal, 20, process)
    model_process.stop()
    out, err = process.communicate(timeout=120)
    assert process.returncode == 1, err  # incomplete: the documented code for partial results
    envelope = json.loads(out)
    assert envelope["status"] == "partial"
    assert "stayed unavailable for more than 3 s" in envelope["resource"]["halted"]
    metrics = envelope["resource"]["metrics"]
    assert metrics["failed"] == 0 and 20 <= metrics["total_samples"] < 200
    assert (
        json.loads((run_dir(tmp_path, "long") / "metrics.json").read_text())["eval_run"]["status"]
        == "incomplete"
    )

    model_process.go_on()
    resumed = osmosis(
        "eval", "run", str(config), "--name", "long", "-y", "--json", cwd=tmp_path, env=env
    )
    assert resumed.returncode == 0, resumed.stderr
    keys = sorted((e["row_index"], e["run_index"]) for e in read_jsonl(journal))
    assert keys == [(r, 0) for r in range(200)]
    assert json.loads(resumed.stdout)["resource"]["metrics"]["passed"] == 200


# -- the rollout's own errors ----------------------------------------------------------------
RAISES_AT_IMPORT = """
import os
raise RuntimeError("cannot load the tool registry from " + os.getcwd())
"""


def test_an_entrypoint_that_raises_at_import_is_the_users_error(tmp_path, fake_model):
    config = make_workspace(tmp_path, FOUR, limit=4, main=RAISES_AT_IMPORT)
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", cwd=tmp_path, env=model_env(fake_model)
    )
    assert done.returncode == 1
    error = json.loads(done.stderr)["error"]
    assert error["code"] != "INTERNAL" and error["code"] == "VALIDATION"
    assert "RuntimeError: cannot load the tool registry from" in error["message"]
    assert "bug in osmosis" not in done.stderr


def test_a_run_that_failed_its_model_pre_flight_does_not_hold_its_name(tmp_path, fake_model):
    config = make_workspace(tmp_path, FOUR, limit=4)
    nowhere = model_env(fake_model, OPENAI_API_BASE="http://127.0.0.1:9/v1")  # nothing listens
    failed = osmosis("eval", "run", str(config), "--name", "mine", "-y", "--json", cwd=tmp_path,
                     env=nowhere)  # fmt: skip
    assert failed.returncode == 1
    assert "pre-flight failed" in json.loads(failed.stderr)["error"]["message"]
    assert not run_dir(tmp_path, "mine").exists()
    # The name is free: the same name with other inputs (-n 2) runs, no --fresh needed.
    done = osmosis("eval", "run", str(config), "--name", "mine", "-n", "2", "-y", cwd=tmp_path,
                   env=model_env(fake_model))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(read_jsonl(run_dir(tmp_path, "mine") / "events.jsonl")) == 8


GARBLES_ONE_RESULT = SCRIPTED_MAIN.replace(
    'if __name__ == "__main__":',
    """
_inner = app


async def app(scope, receive, send):  # row "garble"'s final result, out of the protocol
    # The result comes on a poll, or on the admission the engine asked to hold open.
    final = scope["type"] == "http" and (
        scope["path"].endswith("/result") or scope["path"] == "/rollout"
    )
    if not final:
        return await _inner(scope, receive, send)
    start = {}

    async def garbling(message):
        if message["type"] == "http.response.start":
            start.update(message)
            return
        body = message.get("body", b"")
        if b"[garble]" in body and b'"status":"success"' in body.replace(b" ", b""):
            body = b'{"status": "done!"}'
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    await _inner(scope, receive, garbling)


if __name__ == "__main__":""",
)


def test_a_garbled_result_body_is_that_attempts_protocol_error_not_a_silent_pending(
    tmp_path, fake_model
):
    rows = [row("pass", 2, 2), row("garble", 3, 3), row("pass", 4, 4), row("pass", 5, 5)]
    config = make_workspace(tmp_path, rows, limit=4, main=GARBLES_ONE_RESULT)
    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "g",
        "-y",
        "--json",
        cwd=tmp_path,
        env=model_env(fake_model),
    )
    assert done.returncode == 0, done.stderr
    index = read_jsonl(run_dir(tmp_path, "g") / "index.jsonl")
    assert [(r["status"], r.get("error_type")) for r in index] == [
        ("success", None),
        ("failed", "rollout_protocol_error"),
        ("success", None),
        ("success", None),
    ]
    journal = {e["row_index"]: e for e in read_jsonl(run_dir(tmp_path, "g") / "events.jsonl")}
    assert "malformed result body" in journal[1]["error_message"]


# -- nothing slow blocks the run -------------------------------------------------------------
SLOW_BACKEND = """
import os
import time
from pathlib import Path

MARK = Path({mark!r})


def _stall(*args, **kwargs):
    MARK.write_text(str(os.getpid()))
    time.sleep(600)


get_requires_for_build_wheel = lambda config_settings=None: []
prepare_metadata_for_build_wheel = _stall
build_wheel = _stall
"""


def test_ctrl_c_while_the_environment_builds_stops_uv_and_exits_130(tmp_path, fake_model):
    config = make_workspace(tmp_path, FOUR, limit=4)
    slow = tmp_path / "slowpkg"
    slow.mkdir()
    mark = tmp_path / "building.mark"
    (slow / "backend.py").write_text(SLOW_BACKEND.format(mark=str(mark)))
    (slow / "pyproject.toml").write_text(
        '[project]\nname = "slowpkg"\nversion = "0.1"\n\n'
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (tmp_path / "rollouts" / "scripted" / "pyproject.toml").write_text(
        '[project]\nname = "scripted"\nversion = "0.1"\nrequires-python = ">=3.11"\n'
        f'dependencies = ["slowpkg @ {slow.as_uri()}"]\n'
    )
    process = subprocess.Popen(
        [*CLI, "eval", "run", str(config), "--name", "build", "-y", "--json"],
        cwd=tmp_path,
        env={**model_env(fake_model), "UV_CACHE_DIR": str(tmp_path / "uv-cache")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (mark.exists() and mark.read_text()):  # uv runs the build backend now
            assert time.monotonic() < deadline and process.poll() is None, "no build started"
            time.sleep(0.1)
        backend = int(mark.read_text())
        assert running(backend)
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == 130, err
    assert time.monotonic() - interrupted < 20  # not the 600 s the build would take
    assert json.loads(err)["error"]["code"] == "INTERRUPTED"
    time.sleep(0.5)
    assert not running(backend)  # uv's build backend was stopped with it
    assert not list((tmp_path / ".osmosis" / "envs").glob(".build-*"))  # no half-built venv


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and " Z " not in stat.read_text()


# -- a bridge other machines can reach (issue 11.7) -------------------------------------------
PRINTS_BRIDGE_URL = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)",
    "        from osmosis.rollout.context import get_rollout_context\n"
    '        print("bridge url:", get_rollout_context().chat_completions_url, flush=True)\n'
    "        reply = await ctx.chat(ctx.prompt)",
)


def test_rollouts_reach_the_bridge_at_the_advertised_url(tmp_path, fake_model):
    config = make_workspace(tmp_path, FOUR, limit=4, main=PRINTS_BRIDGE_URL)
    done = osmosis(
        "eval", "run", str(config), "--name", "adv", "-y", "--json",
        "--bridge-host", "127.0.0.1", "--bridge-url", "http://localhost",
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["metrics"]["passed"] == 4
    log = (run_dir(tmp_path, "adv") / "logs.txt").read_text()
    urls = re.findall(r"bridge url: (\S+)", log)
    assert len(urls) == 4
    # A port-less advertised URL keeps the bound port; each attempt has its own rollout path.
    assert all(re.fullmatch(r"http://localhost:\d+/v1/rollouts/[0-9a-f]{32}", u) for u in urls)


# -- offline at start (issue 17.5) ------------------------------------------------------------
PRINTS_OFFLINE = (
    'print("offline:", *(f"{k}={os.environ.get(k)}" for k in ('
    '"LITELLM_LOCAL_MODEL_COST_MAP", "LITELLM_OFFLINE_MODE", "HF_HUB_DISABLE_TELEMETRY",'
    ' "DO_NOT_TRACK")), flush=True)\n'
)
OFFLINE_LINE = (
    "offline: LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_OFFLINE_MODE=true "
    "HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1"
)
IMPORTS_LITELLM = SCRIPTED_MAIN.replace(
    "import uvicorn\n", "import uvicorn\nimport litellm\n" + PRINTS_OFFLINE
)


def test_a_rollout_that_imports_litellm_makes_no_lookup_at_start(tmp_path, fake_model):
    config = make_workspace(tmp_path, FOUR, limit=4, main=IMPORTS_LITELLM)
    env = {k: v for k, v in model_env(fake_model).items() if not k.startswith("LITELLM_")}
    done = osmosis("eval", "run", str(config), "--name", "offline", "-y", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    log = (run_dir(tmp_path, "offline") / "logs.txt").read_text()
    assert OFFLINE_LINE in log
    assert "model cost map fetch" not in log and "Failed to fetch remote model cost map" not in log


@pytest.mark.interop
def test_an_osmosis_ai_rollout_starts_with_the_offline_settings(tmp_path, fake_model):
    main = OSMOSIS_AI_MAIN.replace("import uvicorn\n", "import uvicorn\n" + PRINTS_OFFLINE)
    config = make_workspace(tmp_path, FOUR, limit=4, main=main)
    (tmp_path / "rollouts" / "scripted" / "pyproject.toml").write_text(OSMOSIS_AI_PYPROJECT)
    env = {k: v for k, v in model_env(fake_model).items() if not k.startswith("LITELLM_")}
    done = osmosis(
        "eval", "run", str(config), "--name", "ai", "-y", cwd=tmp_path, env=env, timeout=600
    )
    interop = Path(__file__).resolve().parents[2] / ".venv-interop" / "bin" / "python"
    if done.returncode != 0 and not interop.exists():
        pytest.skip(f"osmosis-ai cannot be installed on this machine: {done.stderr[-400:]}")
    assert done.returncode == 0, done.stderr
    log = (run_dir(tmp_path, "ai") / "logs.txt").read_text()
    assert OFFLINE_LINE in log
    assert "model cost map fetch" not in log


# -- the platform maps the same errors the same way ------------------------------------------
def test_the_platform_fails_a_run_whose_entrypoint_raises_with_the_clis_message(
    tmp_path, fake_model
):
    from tests.platform.eval_world import Server, finished, make_repo, submit, upload_dataset

    rows = [row("pass", a, 3) for a in range(2, 6)]
    local = make_workspace(tmp_path / "local", rows, limit=4, main=RAISES_AT_IMPORT)
    cli = osmosis(
        "eval", "run", str(local), "-y", "--json", cwd=tmp_path / "local", env=model_env(fake_model)
    )
    cli_message = json.loads(cli.stderr)["error"]["message"]
    server = Server.start(tmp_path / "platform", fake_model)
    try:
        repo = make_repo(tmp_path / "ws", rows, limit=4, main=RAISES_AT_IMPORT)
        upload_dataset(server, repo)
        with server.client() as client:
            detail = finished(client, submit(client, repo).id)
    finally:
        server.stop()
    assert detail.eval_run.status == "failed"
    error = detail.eval_run.error or ""
    # The same words (the last line names each run's own checkout), and the same hint.
    assert cli_message.splitlines()[0] in error
    assert "RuntimeError: cannot load the tool registry from" in error
    assert error.endswith("(fix the rollout's entrypoint; nothing was dispatched)")
