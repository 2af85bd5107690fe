"""prepare_environment with real uv, real interpreters and PyPI: build once, reuse, run in it."""

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites import environment as environment_module
from osmosis.eval.sites.environment import (
    RolloutEnvironmentError,
    choose_interpreter,
    find_interpreters,
    find_uv,
    prepare_environment,
)
from osmosis.eval.sites.rollout_process import RolloutProcess

ROLLOUTS = Path(__file__).parent / "rollouts"
MULTIPLY = Path(__file__).parents[2] / "examples" / "workspace" / "rollouts" / "multiply"
CURRENT_VERSION = Version(".".join(map(str, sys.version_info[:3])))
# What uv prints when the index cannot be reached: the test is about us, not the network.
NETWORK_TROUBLE = ("failed to fetch", "dns error", "error sending request", "connect error")


def rollout_with(tmp_path: Path, pyproject: str) -> Path:
    rollout = tmp_path / "rollout-under-test"
    rollout.mkdir()
    (rollout / "pyproject.toml").write_text(pyproject)
    (rollout / "main.py").write_text("")
    return rollout


def skip_if_offline(error: RolloutEnvironmentError) -> None:
    if any(marker in str(error).lower() for marker in NETWORK_TROUBLE):
        pytest.skip(f"the package index is unreachable, so uv cannot install: {error}")


def forbid_uv(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("uv was invoked for an environment that should be reused")

    monkeypatch.setattr(environment_module, "_run_uv", refuse)


# --- fast: no uv build ------------------------------------------------------------------------


def test_a_rollout_without_pyproject_runs_with_the_current_interpreter(tmp_path):
    log: list[str] = []
    env = prepare_environment(MULTIPLY, cache_root=tmp_path, log=log.append)
    assert (env.python, env.kind, env.cache_key, env.sdk) == (
        Path(sys.executable),
        "current",
        None,
        "osmosis",
    )
    assert env.venv is None
    assert log == ["→ no pyproject.toml: running the rollout with the current interpreter"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("pyproject", "reason"),
    [
        ("[project\n", "reading pyproject.toml failed"),
        ('[project]\ndependencies = ["six >>> 1"]\n', "invalid dependency 'six >>> 1'"),
        ("[project]\ndependencies = 'six'\n", "must be a list of strings"),
        ('[project]\nrequires-python = "3.12"\n', "invalid requires-python"),
    ],
)
def test_a_broken_declaration_names_the_rollout_and_the_step(tmp_path, pyproject, reason):
    rollout = rollout_with(tmp_path, pyproject)
    with pytest.raises(RolloutEnvironmentError) as caught:
        prepare_environment(rollout, cache_root=tmp_path / "cache", log=[].append)
    message = str(caught.value)
    assert message.startswith("rollout 'rollout-under-test': reading pyproject.toml failed")
    assert reason in message
    assert caught.value.step == "reading pyproject.toml"


def test_an_unsatisfiable_python_requirement_says_what_was_found(tmp_path):
    rollout = rollout_with(tmp_path, '[project]\nrequires-python = ">=3.99"\n')
    with pytest.raises(RolloutEnvironmentError) as caught:
        prepare_environment(rollout, cache_root=tmp_path / "cache", log=[].append)
    message = str(caught.value)
    assert "choosing a Python interpreter failed" in message
    assert ">=3.99" in message
    assert f"{CURRENT_VERSION} ({sys.executable})" in message  # what was found
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_the_current_interpreter_wins_when_it_satisfies():
    chosen = choose_interpreter(SpecifierSet(f">={CURRENT_VERSION.major}.{CURRENT_VERSION.minor}"))
    assert chosen.path == Path(sys.executable)
    assert chosen.version == CURRENT_VERSION


def test_otherwise_the_lowest_satisfying_interpreter_is_chosen():
    spec = SpecifierSet(f">{CURRENT_VERSION}")
    newer = [i for i in find_interpreters() if i.version in spec]
    if not newer:
        pytest.skip(f"no Python newer than {CURRENT_VERSION} is installed here")
    chosen = choose_interpreter(spec)
    assert chosen.version == min(i.version for i in newer)
    assert chosen.version in spec


def test_uv_is_found_and_runs():
    completed = subprocess.run([*find_uv(), "--version"], capture_output=True, text=True)
    assert completed.returncode == 0 and completed.stdout.startswith("uv ")


# --- slow: real uv builds ---------------------------------------------------------------------


@pytest.mark.slow
async def test_a_uv_environment_is_built_once_reused_and_runs_the_rollout(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    logs: list[list[str]] = [[], []]
    results = []
    errors: list[BaseException] = []

    def prepare(log: list[str]) -> None:
        try:
            results.append(
                prepare_environment(ROLLOUTS / "with_six", cache_root=cache, log=log.append)
            )
        except BaseException as exc:
            errors.append(exc)

    # Two runs preparing the same rollout at once: the lock makes one build and one wait.
    threads = [threading.Thread(target=prepare, args=(log,)) for log in logs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        if isinstance(errors[0], RolloutEnvironmentError):
            skip_if_offline(errors[0])
        raise errors[0]
    syncing = [line for log in logs for line in log if line.startswith("→ syncing")]
    assert len(syncing) == 1, logs
    assert sum("→ reusing cached environment" in line for log in logs for line in log) == 1
    assert results[0] == results[1]
    env = results[0]
    assert env.kind == "uv" and env.sdk == "osmosis" and env.cache_key is not None
    assert env.python == cache / env.cache_key / "bin" / "python"
    assert sorted(p.name for p in cache.iterdir()) == [env.cache_key, f"{env.cache_key}.lock"]

    forbid_uv(monkeypatch)  # an unchanged declaration must not reach uv at all
    log: list[str] = []
    assert prepare_environment(ROLLOUTS / "with_six", cache_root=cache, log=log.append) == env
    assert log == [
        f"→ reusing cached environment {env.cache_key[:12]} (Python {CURRENT_VERSION}, osmosis SDK)"
    ]

    lines: list[str] = []
    async with await RolloutProcess.start(
        env,
        ROLLOUTS / "with_six",
        "main.py",
        env={},
        artifact_root=tmp_path / "artifacts",
        log=lines.append,
        redactor=Redactor([]),
        startup_timeout=60,
    ) as process:
        assert (await process.health())["status"] == "ok"
    banner = next(line for line in lines if "six=" in line)
    assert f"prefix={env.venv}" in banner
    source = Path(environment_module.__file__).parents[2]  # the running osmosis package
    assert f"osmosis={source / '__init__.py'}" in banner


@pytest.mark.slow
def test_a_uv_lock_pins_what_gets_installed(tmp_path):
    rollout = tmp_path / "locked"
    shutil.copytree(ROLLOUTS / "with_six", rollout)
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    locked = subprocess.run(
        [*find_uv(), "lock", "--python", sys.executable],
        cwd=rollout,
        env=env,
        capture_output=True,
        text=True,
    )
    if locked.returncode != 0:
        # Only an unreachable index is a reason to skip; any other uv failure is a failure.
        assert any(m in locked.stderr.lower() for m in NETWORK_TROUBLE), locked.stderr[-500:]
        pytest.skip(f"the package index is unreachable, so uv cannot lock: {locked.stderr[-500:]}")
    try:
        prepared = prepare_environment(rollout, cache_root=tmp_path / "cache", log=[].append)
    except RolloutEnvironmentError as exc:
        skip_if_offline(exc)
        raise
    assert prepared.venv is not None
    requirements = (prepared.venv / "osmosis-requirements.txt").read_text().splitlines()
    assert any(line.startswith("six==") for line in requirements)  # the lock's pin
    assert "six>=1.16" not in requirements
    assert not (rollout / ".venv").exists()  # the rollout directory is left alone


DYNAMIC_PYPROJECT = """
[project]
name = "dynamic-rollout"
version = "0.1.0"
dynamic = ["dependencies"]

[tool.setuptools]
py-modules = []

[tool.setuptools.dynamic]
dependencies = { file = ["requirements.txt"] }

[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
"""


@pytest.mark.slow
def test_dynamic_dependencies_are_installed_by_building_a_copy_of_the_rollout(tmp_path):
    rollout = rollout_with(tmp_path, DYNAMIC_PYPROJECT)
    (rollout / "requirements.txt").write_text("six\n")
    before = sorted(p.name for p in rollout.iterdir())
    try:
        env = prepare_environment(rollout, cache_root=tmp_path / "cache", log=[].append)
    except RolloutEnvironmentError as exc:
        skip_if_offline(exc)
        raise
    probe = subprocess.run(
        [env.python, "-c", "import six, osmosis; print(six.__version__)"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    assert sorted(p.name for p in rollout.iterdir()) == before  # no build/ or *.egg-info
    assert env.venv is not None and not (env.venv / "osmosis-rollout-source").exists()


@pytest.mark.slow
def test_a_failed_install_names_the_step_shows_uv_output_and_caches_nothing(tmp_path):
    rollout = rollout_with(
        tmp_path, '[project]\ndependencies = ["osmosis-test-no-such-package-q7z==0.0.1"]\n'
    )
    cache = tmp_path / "cache"
    with pytest.raises(RolloutEnvironmentError) as caught:
        prepare_environment(rollout, cache_root=cache, log=[].append)
    skip_if_offline(caught.value)
    message = str(caught.value)
    assert message.startswith(
        "rollout 'rollout-under-test': installing the rollout's dependencies failed: uv exited"
    )
    assert "osmosis-test-no-such-package-q7z" in "\n".join(caught.value.output_tail)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.slow
async def test_an_osmosis_ai_rollout_gets_python_3_12_and_serves_health(tmp_path):
    log: list[str] = []
    try:
        env = prepare_environment(ROLLOUTS / "osmosis_ai_echo", cache_root=tmp_path, log=log.append)
    except RolloutEnvironmentError as exc:
        if "choosing a Python interpreter" in str(exc):
            pytest.skip(f"no Python >= 3.12 on this machine: {exc}")
        skip_if_offline(exc)
        raise
    lowest = min(i.version for i in find_interpreters() if i.version >= Version("3.12"))
    assert env.sdk == "osmosis-ai" and env.kind == "uv"
    assert log[0].startswith("→ syncing rollout dependencies")
    assert f"(Python {lowest}, osmosis-ai SDK)" in log[0]
    lines: list[str] = []
    async with await RolloutProcess.start(
        env,
        ROLLOUTS / "osmosis_ai_echo",
        "main.py",
        env={},
        artifact_root=tmp_path / "artifacts",
        log=lines.append,
        redactor=Redactor([]),
        startup_timeout=60,
    ) as process:
        health = await process.health()
    assert health["instance_id"] == process.instance_id
    assert health["concurrency"]["max_concurrent"] == 4
    assert f"[rollout] python={lowest}" in lines
