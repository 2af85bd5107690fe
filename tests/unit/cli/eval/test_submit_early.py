"""`eval submit` starts its pre-flight import at the command's entry, before typer parses the
line (`osmosis.cli.eval.submit_early`, issue 30), only for a plain `eval submit CONFIG` line;
the command adopts that child, and one it did not take is killed when the command ends; and
the command line skips httpx's own CLI. Real child interpreters; the entrypoints leave a mark
when imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis.cli.eval import submit_early

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
# Each import appends a line: how many times the entrypoint was imported, and by whom.
MARKING = (
    "import os, time\n"
    "time.sleep({delay})\n"
    "with open({mark!r}, 'a') as f:\n"
    "    f.write(f'{{os.getpid()}}\\n')\n"
)


def workspace(root: Path, *, delay: float = 0.0) -> Path:
    """`configs/eval/smoke.toml` naming `rollouts/bench/main.py`, which marks `root/mark`."""
    (root / "rollouts" / "bench").mkdir(parents=True)
    (root / "configs" / "eval").mkdir(parents=True)
    main = MARKING.format(delay=delay, mark=str(root / "mark"))
    (root / "rollouts" / "bench" / "main.py").write_text(main)
    config = root / "configs" / "eval" / "smoke.toml"
    config.write_text('[experiment]\nrollout = "bench"\nentrypoint = "main.py"\n')
    return config


def imports(root: Path) -> list[str]:
    mark = root / "mark"
    return mark.read_text().split() if mark.exists() else []


@pytest.fixture(autouse=True)
def nothing_left() -> Iterator[None]:
    yield
    submit_early.end()


@pytest.mark.parametrize(
    "options",
    [
        ("-y",),
        ("--json", "--yes", "--wait", "--model", "openai/a", "--model=openai/b", "-n", "2"),
        ("--secrets-file", ".secrets", "--cache", "use", "--replay-from", "smoke-1", "--plain"),
        ("--limit", "1", "--platform", "http://127.0.0.1:9", "--workspace", "team"),
    ],
)
def test_a_plain_submit_line_imports_the_entrypoint_once_and_the_command_takes_it(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    config = workspace(tmp_path)
    submit_early.begin(["eval", "submit", str(config), *options], environ={})
    preflight = submit_early.take(config)
    assert preflight is not None
    try:
        assert preflight.result() is None  # imported cleanly
    finally:
        preflight.close()
    assert len(imports(tmp_path)) == 1
    assert preflight.entrypoint == tmp_path / "rollouts" / "bench" / "main.py"
    assert submit_early.take(config) is None  # taken once


def test_a_relative_config_is_taken_by_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = workspace(tmp_path)
    monkeypatch.chdir(tmp_path)
    submit_early.begin(["--json", "eval", "submit", "configs/eval/smoke.toml", "-y"], environ={})
    assert submit_early.take(tmp_path / "configs" / "eval" / "other.toml") is None
    preflight = submit_early.take(Path("configs/eval/smoke.toml"))
    assert preflight is not None
    preflight.close()
    assert config.is_file()


@pytest.mark.parametrize(
    ("line", "environ"),
    [
        (["eval", "submit", "{config}", "--help"], {}),
        (["eval", "submit", "{config}", "--env-file", ".env"], {}),  # its variables: not yet
        (["eval", "submit", "{config}", "-y"], {"OSMOSIS_ENV_FILE": ".env"}),
        (["eval", "submit", "{config}", "--unknown"], {}),
        (["eval", "submit", "{config}", "--model"], {}),  # a value missing
        (["eval", "submit", "{config}", "{config}"], {}),
        (["eval", "submit"], {}),
        (["eval", "run", "{config}", "-y"], {}),
        (["eval", "submit", "{outside}", "-y"], {}),  # not under configs/eval/
    ],
)
def test_any_other_line_imports_nothing_early(
    tmp_path: Path, line: list[str], environ: dict[str, str]
) -> None:
    config = workspace(tmp_path)
    outside = tmp_path / "smoke.toml"
    outside.write_text(config.read_text())
    argv = [arg.format(config=config, outside=outside) for arg in line]
    submit_early.begin(argv, environ=environ)
    assert submit_early.take(config) is None
    assert submit_early.take(outside) is None
    time.sleep(0.5)  # a child, had one started, would have marked by now
    assert imports(tmp_path) == []


@pytest.mark.slow
def test_a_command_that_fails_before_the_import_is_taken_kills_the_child(
    tmp_path: Path,
) -> None:
    # The line is refused after the entry started the import (--cache must be off, use or
    # replay): the slow entrypoint is still sleeping then, and must never get to mark.
    config = workspace(tmp_path, delay=1.5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    result = subprocess.run(
        [*CLI, "--json", "eval", "submit", str(config), "-y", "--cache", "bogus"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "--cache must be off, use or replay" in result.stderr
    time.sleep(2.5)
    assert imports(tmp_path) == []


# `begin` in a fresh interpreter, as `run()` calls it: what it loaded by the time it started.
EARLY_PROBE = """
import json, sys
from pathlib import Path
from osmosis.cli.eval import submit_early
submit_early.begin(sys.argv[1:])
loaded = sorted(sys.modules)
early = submit_early.take(Path(sys.argv[3]))
if early is not None:
    early.close()
print("EARLY " + json.dumps({"started": early is not None, "modules": loaded}))
"""


def test_the_early_start_loads_neither_pydantic_nor_the_client(tmp_path: Path) -> None:
    # Otherwise it would itself cost what it is there to overlap.
    config = workspace(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", EARLY_PROBE, "eval", "submit", str(config), "-y"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("EARLY ")]
    early = json.loads(line.removeprefix("EARLY "))
    assert early["started"], done.stderr  # the check below is of a real start
    heavy = {"pydantic", "httpx", "osmosis.client", "osmosis.wire", "osmosis.eval.inputs.config"}
    assert sorted(heavy.intersection(early["modules"])) == []


def test_the_command_line_never_loads_httpx_s_own_command_line(tmp_path: Path) -> None:
    # `auth whoami` with no login: the client (httpx) is imported, then the command says to
    # log in. httpx's own CLI (click, pygments: ~0.05 s of CPU) is never needed.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env.update(OSMOSIS_HOME=str(tmp_path / "home"), OSMOSIS_CONFIG_DIR=str(tmp_path / "cfg"))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *CLI[1:], "--json", "auth", "whoami"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert '"code": "AUTH_REQUIRED"' in done.stderr  # it got past the client's import
    assert "httpx" in imported
    assert sorted(imported.intersection({"click", "pygments"})) == []
