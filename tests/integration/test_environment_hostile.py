"""A rollout's files are hostile to the environment build: linked inputs are refused, a
committed `uv.toml` steers nothing, venvs are never shared across workspaces and are read-only.

Real uv, offline: packages come from a find-links directory of wheels built here, which the
operator's environment (`UV_FIND_LINKS`) names, as an operator would name a local index.
"""

import base64
import hashlib
import itertools
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from osmosis.eval.sites import environment as environment_module
from osmosis.eval.sites.environment import (
    BuildInputLinkError,
    RolloutEnvironmentError,
    prepare_environment,
)
from osmosis.eval.sites.sandbox.layout import SandboxLayout, bwrap_mounts

SECRET = "MARKER-host-secret-7f3a"
PYPROJECT = """\
[project]
name = "r"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["victim>=1.0"]
"""
HOOK = "victim_hook.pth"


def wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel written with zipfile: the files, and a dist-info with a RECORD."""
    dist = f"{name}-{version}.dist-info"
    entries = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    entries[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as archive:
        for path, text in entries.items():
            archive.writestr(path, text)
    return target


@pytest.fixture
def offline_index(tmp_path, monkeypatch) -> Path:
    """The operator's wheels (`victim` 1.0, harmless), offline, and no SDK to install: the
    test is about what the rollout's files can steer, not about our SDK's build."""
    wheels = tmp_path / "operator-wheels"
    wheel(wheels, "victim", "1.0", {"victim/__init__.py": "VERSION = '1.0'\n"})
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setattr(environment_module, "_our_requirement", lambda rollout: None)
    return wheels


def workspace(root: Path, files: dict[str, str]) -> Path:
    rollout = root / "rollouts" / "r"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text("import victim\n")
    for name, text in files.items():
        (rollout / name).write_text(text)
    return rollout


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


# --- 1. linked build inputs -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["uv.toml", "uv.lock", "pyproject.toml", ".python-version"])
def test_a_linked_build_input_is_refused_before_uv_naming_the_link(tmp_path, monkeypatch, name):
    secret = tmp_path / "host" / "secret.key"
    secret.parent.mkdir()
    secret.write_text(f'secret = "{SECRET}"\n')
    checkout = tmp_path / "checkout"
    rollout = workspace(checkout, {"pyproject.toml": PYPROJECT})
    (rollout / name).unlink(missing_ok=True)
    (rollout / name).symlink_to(secret)

    def refuse(*args, **kwargs):
        raise AssertionError("uv ran on a linked build input")

    monkeypatch.setattr(environment_module, "_run_uv", refuse)
    log: list[str] = []
    with pytest.raises(BuildInputLinkError) as caught:
        prepare_environment(
            rollout, cache_root=tmp_path / "envs", log=log.append, checkout=checkout
        )
    assert f"rollouts/r/{name} is a symbolic link; build inputs must be regular files" in str(
        caught.value
    )
    assert caught.value.path == f"rollouts/r/{name}"
    assert isinstance(caught.value, RolloutEnvironmentError)  # the run error family
    shown = "\n".join([str(caught.value), caught.value.hint, *log])
    assert SECRET not in shown and str(tmp_path / "host") not in shown


def test_a_link_anywhere_in_a_dynamic_projects_build_copy_is_refused(tmp_path, monkeypatch):
    secret = tmp_path / "secret.key"
    secret.write_text(SECRET)
    checkout = tmp_path / "checkout"
    rollout = workspace(
        checkout,
        {
            "pyproject.toml": PYPROJECT.replace(
                'dependencies = ["victim>=1.0"]', 'dynamic = ["dependencies"]'
            )
        },
    )
    (rollout / "pkg").mkdir()
    (rollout / "pkg" / "data.txt").symlink_to(secret)
    monkeypatch.setattr(environment_module, "_run_uv", None)  # never reached
    with pytest.raises(BuildInputLinkError, match=r"rollouts/r/pkg/data\.txt is a symbolic link"):
        prepare_environment(rollout, cache_root=tmp_path / "envs", log=[].append, checkout=checkout)


def test_uv_output_in_an_error_names_no_host_path_and_is_capped():
    home = str(Path.home())
    shown = environment_module._shown(
        [
            f"error: failed to read {home}/.config/secret",
            "x" * 5000,
            "error: /srv/osmosis/envs/.build-k/bin/python: /srv/checkouts/run-1/rollouts/r/a",
        ],
        Path("/srv/checkouts/run-1/rollouts/r"),
        Path("/srv/osmosis/envs"),
    )
    assert shown[0] == "error: failed to read ~/.config/secret"
    assert len(shown[1]) < 400
    assert shown[2] == "error: <env-cache>/.build-k/bin/python: ./a"


# --- 2. another workspace's find-links wheel --------------------------------------------------


def test_a_uv_toml_with_poisoned_find_links_steers_neither_its_build_nor_another_workspaces(
    tmp_path, offline_index
):
    marker = tmp_path / "the-hook-ran"
    poisoned = tmp_path / "poisoned-wheels"
    wheel(
        poisoned,
        "victim",
        "2.0",  # higher than the operator's: chosen whenever the find-links is consulted
        {
            "victim/__init__.py": "VERSION = '2.0'\n",
            HOOK: f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n",
        },
    )
    a = workspace(
        tmp_path / "a",
        {"pyproject.toml": PYPROJECT, "uv.toml": f'find-links = ["{poisoned}"]\n'},
    )
    b = workspace(tmp_path / "b", {"pyproject.toml": PYPROJECT})
    cache = tmp_path / "envs"  # the platform's one shared cache

    env_a = prepare_environment(
        a, cache_root=cache, log=[].append, scope="workspace:a", checkout=tmp_path / "a"
    )
    log_b: list[str] = []
    env_b = prepare_environment(
        b, cache_root=cache, log=log_b.append, scope="workspace:b", checkout=tmp_path / "b"
    )

    assert env_a.venv is not None and env_b.venv is not None
    assert not (site_packages(env_a.venv) / HOOK).exists()  # --no-config: A's uv.toml unread
    assert env_b.cache_key != env_a.cache_key
    assert not any("reusing cached environment" in line for line in log_b)
    assert not (site_packages(env_b.venv) / HOOK).exists()
    version = subprocess.run(
        [str(env_b.python), "-c", "import victim; print(victim.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "1.0"
    assert not marker.exists()


# --- 3. a cached venv is read-only ------------------------------------------------------------


def test_a_cached_venv_is_read_only_and_still_reused(tmp_path, offline_index):
    rollout = workspace(tmp_path / "b", {"pyproject.toml": PYPROJECT})
    cache = tmp_path / "envs"
    env = prepare_environment(rollout, cache_root=cache, log=[].append, scope="workspace:b")
    assert env.venv is not None
    module = site_packages(env.venv) / "victim" / "__init__.py"
    for path in [env.venv, *env.venv.rglob("*")]:
        if not path.is_symlink():
            assert stat.S_IMODE(path.lstat().st_mode) & 0o222 == 0, path
    if os.geteuid() != 0:  # root ignores mode bits: there, the sandbox's read-only bind holds
        with pytest.raises(PermissionError):
            module.write_text("VERSION = 'changed'\n")
        with pytest.raises(PermissionError):
            (module.parent / "added.py").write_text("")

    # The sandbox binds the venv read-only, never writable.
    site = tmp_path / "site"
    mounts = bwrap_mounts(
        SandboxLayout(
            workspace=tmp_path / "b",
            rollout_dir=rollout,
            trials_root=tmp_path / "trials",
            python=env.python,
            venv=env.venv,
            site_dir=site,
            shim=site / "shim.py",
        )
    )
    binds = list(itertools.pairwise(mounts))
    assert ("--ro-bind", str(env.venv)) in binds
    assert not [path for flag, path in binds if flag == "--bind" and env.venv.is_relative_to(path)]

    log: list[str] = []
    again = prepare_environment(rollout, cache_root=cache, log=log.append, scope="workspace:b")
    assert again == env
    assert any(f"→ reusing cached environment {env.cache_key[:12]}" in line for line in log)
