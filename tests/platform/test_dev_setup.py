"""The README's `make test` works on a fresh machine: it installs what the tests need beyond
Python (Debian's chromium) through the same script CI runs, and that script is cheap and
silent on a machine that has it already."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-system-deps.sh"


def dry_run(target: str) -> str:
    """The commands `make TARGET` would run (`make -n`), without running any."""
    done = subprocess.run(
        ["make", "-n", target], cwd=REPO, capture_output=True, text=True, check=True
    )
    return done.stdout


def script(*args: str, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def bin_dir(root: Path, *commands: str) -> Path:
    """A directory holding an executable per name; apt-get/sudo ones fail loudly if run."""
    root.mkdir(parents=True, exist_ok=True)
    for name in commands:
        tool = root / name
        tool.write_text(f"#!/bin/sh\necho ran {name} >> {root / 'ran.log'}\nexit 0\n")
        tool.chmod(0o755)
    return root


def test_make_test_and_ci_install_system_packages_through_one_script():
    assert "bash scripts/install-system-deps.sh" in dry_run("test")
    assert "bash scripts/install-system-deps.sh" in dry_run("test-fast")
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/install-system-deps.sh" in ci
    assert "apt-get" not in ci  # one place installs packages: the script


def test_the_script_does_nothing_when_chromium_is_there(tmp_path):
    tools = bin_dir(tmp_path / "bin", "chromium", "apt-get", "sudo")
    done = script(path=f"{tools}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert f"chromium: present ({tools / 'chromium'})" in done.stdout
    assert not (tools / "ran.log").exists()  # neither apt-get nor sudo was asked anything


def test_check_mode_names_what_is_missing_and_how_to_install_it(tmp_path):
    empty = tmp_path / "empty"  # bash runs by its absolute path; nothing else is on PATH
    empty.mkdir()
    done = script("--check", path=str(empty))
    assert done.returncode == 1
    assert "missing: chromium" in done.stdout
    assert "apt-get install -y chromium" in done.stdout


def test_without_root_or_sudo_the_script_fails_with_the_command_to_run(tmp_path):
    tools = bin_dir(tmp_path / "bin", "apt-get")
    # A user who is not root (whoever runs the suite) and has no sudo.
    (tools / "id").write_text("#!/bin/sh\necho 1000\n")
    (tools / "id").chmod(0o755)
    done = script(path=str(tools))
    assert done.returncode == 1
    assert "installing needs root. Run: sudo apt-get install -y chromium" in done.stderr
    assert not (tools / "ran.log").exists()
