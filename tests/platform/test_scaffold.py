"""The first hour: `osmosis init`, `doctor`, `rollout init` and `template list|apply` make a
workspace that our checks, osmosis-ai's checks and git all accept. Real git repositories and
real `osmosis` processes; no platform."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from osmosis.templates import TEMPLATES, template_files
from tests.e2e.conftest import model_env
from tests.platform.conftest import CLI, clean_env

REPO = Path(__file__).resolve().parents[2]
INTEROP = REPO / ".venv-interop" / "bin" / "osmosis"
REFERENCE_PATHS = [
    "rollouts/",
    "configs/training/",
    "configs/eval/",
    "data/",
    "AGENTS.md",
    "CLAUDE.md",
    "configs/AGENTS.md",
]


def run(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90):
    return subprocess.run(
        list(args),
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90):
    return run(*CLI, *args, cwd=cwd, env=env, timeout=timeout)


def cli_json(*args: str, cwd: Path, env: dict[str, str] | None = None) -> dict:
    done = cli("--json", *args, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cli_error(*args: str, cwd: Path) -> dict:
    done = cli("--json", *args, cwd=cwd)
    assert done.returncode != 0, done.stdout
    return json.loads(done.stderr.strip().splitlines()[-1])["error"]


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=Ada", "-c", "user.email=ada@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """`osmosis init ws` in a fresh directory."""
    done = cli("init", "ws", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "ws"


# -- init --------------------------------------------------------------------------------------
def test_init_makes_a_git_workspace_that_doctor_accepts(tmp_path):
    made = cli_json("init", "ws", cwd=tmp_path)["resource"]
    ws = tmp_path / "ws"
    assert made["git_initialized"] is True and made["kept"] == []
    assert git("rev-parse", "--show-toplevel", cwd=ws).strip() == str(ws.resolve())
    for path in [*REFERENCE_PATHS, ".gitignore", "rollouts/add/main.py", "data/add.jsonl"]:
        assert (ws / path).exists(), path
    checked = cli_json("doctor", cwd=ws)["resource"]
    assert checked["missing"] == [] and checked["valid"] is True and checked["warnings"] == []
    assert checked["required"] == REFERENCE_PATHS


def test_init_keeps_what_exists_and_refuses_a_subdirectory_of_another_repository(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("my own notes\n")
    made = cli_json("init", str(ws), cwd=tmp_path)["resource"]
    assert made["kept"] == ["AGENTS.md"] and (ws / "AGENTS.md").read_text() == "my own notes\n"
    again = cli_json("init", str(ws), cwd=tmp_path)["resource"]
    assert again["created"] == [] and again["git_initialized"] is False

    error = cli_error("init", str(ws / "rollouts"), cwd=tmp_path)
    assert "inside the git repository at" in error["message"]
    assert error["details"]["repository"] == str(ws.resolve())


@pytest.mark.slow
def test_the_example_of_init_evaluates_against_the_scripted_model(workspace, fake_model):
    config = workspace / "configs" / "eval" / "add.toml"
    config.write_text(config.read_text().replace("local/smollm2-135m", "openai/fake-model"))
    done = cli(
        "--json",
        "eval",
        "run",
        "configs/eval/add.toml",
        "--name",
        "first",
        "-y",
        cwd=workspace,
        env=model_env(fake_model, HOME=str(workspace.parent)),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)["resource"]["metrics"]
    assert metrics["total_samples"] == 96  # 24 rows x n = 4
    assert metrics["pass_rate"] == 1.0  # the scripted model adds correctly


@pytest.mark.slow
def test_git_add_after_a_run_commits_no_venv_and_no_run_output(workspace, fake_model):
    # A rollout with its own environment, as `uv sync --project` leaves it, and a run.
    venv = workspace / "rollouts" / "add" / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\n")
    config = workspace / "configs" / "eval" / "add.toml"
    config.write_text(config.read_text().replace("local/smollm2-135m", "openai/fake-model"))
    done = cli(
        "eval",
        "run",
        "configs/eval/add.toml",
        "--rows",
        "0-1",
        "-y",
        cwd=workspace,
        env=model_env(fake_model, HOME=str(workspace.parent)),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert any((workspace / ".osmosis").rglob("events.jsonl"))
    git("add", "-A", cwd=workspace)
    staged = git("diff", "--cached", "--name-only", cwd=workspace).split()
    assert "rollouts/add/main.py" in staged and "configs/training/.gitkeep" in staged
    assert not [p for p in staged if ".osmosis/" in p or "/.venv/" in p or "__pycache__" in p]


# -- doctor ------------------------------------------------------------------------------------
def test_doctor_lists_every_missing_path_and_fix_creates_them(tmp_path):
    tree = tmp_path / "tree"
    (tree / "data").mkdir(parents=True)
    git("init", "-q", cwd=tree)
    error = cli_error("doctor", str(tree), cwd=tmp_path)
    assert error["code"] == "VALIDATION"
    assert error["details"]["missing"] == [p for p in REFERENCE_PATHS if p != "data/"]
    human = cli("doctor", cwd=tree)
    assert human.returncode == 1 and "osmosis doctor --fix" in human.stderr

    fixed = cli_json("doctor", "--fix", cwd=tree / "data")["resource"]
    assert set(fixed["created"]) == {*REFERENCE_PATHS, ".gitignore"} - {"data/"}
    assert fixed["missing"] == [] and (tree / "configs" / "training" / ".gitkeep").is_file()
    assert cli_json("doctor", cwd=tree)["resource"]["created"] == []


def test_doctor_warns_when_git_would_commit_run_output_or_a_venv(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    git("init", "-q", cwd=tree)
    cli_json("doctor", "--fix", cwd=tree)
    (tree / ".gitignore").write_text("*.log\n")  # someone's own ignore file, without ours
    checked = cli("doctor", cwd=tree)
    assert checked.returncode == 0, checked.stderr
    warnings = " ".join(checked.stderr.split())
    assert "git does not ignore .osmosis/" in warnings
    assert "git does not ignore virtual environments" in warnings and "`.venv/`" in warnings


def test_doctor_without_an_origin_checks_the_layout_and_says_what_origin_is_for(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    git("init", "-q", cwd=tree)
    fixed = cli("doctor", "--fix", cwd=tree)
    assert fixed.returncode == 0 and (tree / "rollouts").is_dir()
    warning = " ".join(fixed.stderr.split())
    assert "no `origin` remote" in warning and "platform commands need one" in warning


def test_doctor_outside_a_repository_is_workspace_required(tmp_path):
    error = cli_error("doctor", "--fix", cwd=tmp_path)
    assert error["code"] == "WORKSPACE_REQUIRED"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.interop
def test_osmosis_ai_doctor_and_config_loaders_accept_the_workspace(workspace):
    if not INTEROP.exists():
        pytest.skip("no .venv-interop (make install builds it when osmosis-ai installs here)")
    assert cli("template", "apply", "add-openai-agents", cwd=workspace).returncode == 0
    assert cli("rollout", "init", "my-rollout", cwd=workspace).returncode == 0
    theirs = run(str(INTEROP), "--json", "doctor", str(workspace), cwd=workspace)
    assert theirs.returncode == 0, theirs.stderr
    assert json.loads(theirs.stdout)["resource"]["missing"] == []
    python = INTEROP.parent / "python"
    check = (
        "import sys; from pathlib import Path\n"
        "from osmosis_ai.platform.cli.eval_config import load_eval_submit_config\n"
        "from osmosis_ai.platform.cli.training_config import load_train_submit_config\n"
        "for p in sys.argv[1:]:\n"
        "    load = load_eval_submit_config if '/eval/' in p else load_train_submit_config\n"
        "    load(Path(p)); print('ok', p)\n"
    )
    configs = sorted(str(p) for p in (workspace / "configs").rglob("*.toml"))
    loaded = run(str(python), "-c", check, *configs, cwd=workspace)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.count("ok ") == len(configs) == 4  # add, add-openai-agents, mine x2
    # The OpenAI Agents rollout is valid Python for osmosis-ai's interpreter (3.12).
    compiled = run(
        str(python), "-m", "py_compile", "rollouts/add-openai-agents/main.py", cwd=workspace
    )
    assert compiled.returncode == 0, compiled.stderr


# -- rollout init and templates ----------------------------------------------------------------
def test_rollout_init_scaffolds_a_rollout_and_refuses_to_overwrite_it(workspace):
    made = cli_json("rollout", "init", "my-rollout", cwd=workspace)["resource"]
    assert made["created"] == [
        "rollouts/my-rollout/main.py",
        "rollouts/my-rollout/README.md",
        "configs/eval/my-rollout.toml",
        "configs/training/my-rollout.toml",
        "data/my-rollout.jsonl",
    ]
    toml = (workspace / "configs" / "eval" / "my-rollout.toml").read_text()
    assert 'rollout = "my-rollout"' in toml and "<your-rollout>" not in toml

    clash = cli_error("rollout", "init", "my-rollout", cwd=workspace)
    assert clash["code"] == "CONFLICT"
    assert clash["details"]["existing"] == [
        "rollouts/my-rollout",
        "configs/eval/my-rollout.toml",
        "configs/training/my-rollout.toml",
    ]
    (workspace / "rollouts" / "my-rollout" / "main.py").write_text("# edited\n")
    (workspace / "rollouts" / "my-rollout" / "stale.py").write_text("")
    forced = cli_json("rollout", "init", "my-rollout", "--force", cwd=workspace)["resource"]
    assert "rollouts/my-rollout/main.py" in forced["created"]
    assert not (workspace / "rollouts" / "my-rollout" / "stale.py").exists()
    assert forced["kept"] == [] and "data/my-rollout.jsonl" not in forced["created"]


@pytest.mark.slow
def test_a_new_rollout_runs_as_scaffolded(workspace, fake_model):
    cli_json("rollout", "init", "my-rollout", cwd=workspace)
    config = workspace / "configs" / "eval" / "my-rollout.toml"
    config.write_text(config.read_text().replace("local/smollm2-135m", "openai/fake-model"))
    done = cli(
        "--json",
        "eval",
        "run",
        "configs/eval/my-rollout.toml",
        "-y",
        cwd=workspace,
        env=model_env(fake_model, HOME=str(workspace.parent)),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    metrics = json.loads(done.stdout)["resource"]["metrics"]
    # Every sample row ran and was graded (the scripted model only echoes these questions).
    assert metrics["total_samples"] == 5 and metrics["failed"] == 0
    assert metrics["completed_samples"] == 5


@pytest.mark.parametrize("name", ["My-Rollout", "9lives", "default", "a_b", ""])
def test_rollout_init_names_follow_the_reference_rule(workspace, name):
    error = cli_error("rollout", "init", name, cwd=workspace)
    assert error["code"] == "VALIDATION"
    assert not (workspace / "rollouts" / name).exists() or name == ""


def test_rollout_init_outside_a_workspace_is_workspace_required(tmp_path):
    assert cli_error("rollout", "init", "x", cwd=tmp_path)["code"] == "WORKSPACE_REQUIRED"
    assert list(tmp_path.iterdir()) == []


def test_template_list_and_apply(workspace):
    listed = cli_json("template", "list", cwd=workspace)
    assert [item["name"] for item in listed["items"]] == ["add", "add-tools", "add-openai-agents"]

    applied = cli_json("template", "apply", "add-tools", cwd=workspace)["resource"]
    assert applied["created"] == ["configs/eval/add-tools.toml", "rollouts/add-tools/main.py"]
    assert applied["unchanged"] == ["data/add.jsonl"]  # shared with the example init wrote

    agents = cli_json("template", "apply", "add-openai-agents", cwd=workspace)["resource"]
    pyproject = (workspace / "rollouts" / "add-openai-agents" / "pyproject.toml").read_text()
    assert "rollouts/add-openai-agents/pyproject.toml" in agents["created"]
    assert '"osmosis-ai[server,openai-agents]' in pyproject and ">=3.12" in pyproject

    # `init` wrote the add template: applying it (or any template again) changes nothing.
    again = cli_json("template", "apply", "add", cwd=workspace)["resource"]
    assert again["created"] == [] and again["replaced"] == []
    assert "rollouts/add/main.py" in again["unchanged"]
    # Only a file that differs from the template's is refused, and named.
    edited = workspace / "rollouts" / "add-tools" / "main.py"
    edited.write_text(edited.read_text() + "# my change\n")
    clash = cli_error("template", "apply", "add-tools", cwd=workspace)
    assert clash["code"] == "CONFLICT"
    assert clash["details"]["existing"] == ["rollouts/add-tools/main.py"]
    assert edited.read_text().endswith("# my change\n")
    unknown = cli_error("template", "apply", "multiply", cwd=workspace)
    assert unknown["code"] == "NOT_FOUND" and unknown["details"]["templates"] == list(TEMPLATES)


@pytest.mark.slow
def test_the_tool_agent_template_calls_its_tool_against_the_scripted_model(workspace, fake_model):
    cli_json("template", "apply", "add-tools", cwd=workspace)
    done = cli(
        "--json",
        "eval",
        "run",
        "configs/eval/add-tools.toml",
        "--rows",
        "0-3",
        "--name",
        "tools",
        "-y",
        cwd=workspace,
        env=model_env(fake_model, HOME=str(workspace.parent)),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["metrics"]["pass_rate"] == 1.0
    trajectory = workspace / ".osmosis" / "evals" / "tools" / "trajectories" / "row_0_run_0.json"
    assert '"add"' in trajectory.read_text()  # the tool call is in the trajectory


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(900)  # builds an environment with osmosis-ai and openai-agents
def test_the_openai_agents_template_runs_its_agent_against_the_scripted_model(
    workspace, fake_model
):
    if not INTEROP.exists():
        pytest.skip("no .venv-interop (make install builds it when osmosis-ai installs here)")
    cli_json("template", "apply", "add-openai-agents", cwd=workspace)
    env = model_env(fake_model, HOME=str(workspace.parent))
    done = cli(
        "--json",
        "eval",
        "run",
        "configs/eval/add-openai-agents.toml",
        "--rows",
        "0-1",
        "--name",
        "agents",
        "-y",
        cwd=workspace,
        env=env,
        timeout=900,
    )
    if done.returncode != 0 and "uv" in done.stderr and "failed" in done.stderr:
        pytest.skip(f"osmosis-ai[openai-agents] cannot be installed here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["metrics"]["pass_rate"] == 1.0
    trajectory = workspace / ".osmosis" / "evals" / "agents" / "trajectories" / "row_0_run_0.json"
    calls = [
        call.get("function_name")
        for step in json.loads(trajectory.read_text())["steps"]
        for call in step.get("tool_calls") or []
    ]
    assert calls == ["add"]  # the agent called its function tool, then answered


# -- the templates are the example, and they ship in the wheel ---------------------------------
def test_the_example_workspace_is_what_the_add_template_writes():
    example = REPO / "examples" / "workspace"
    for path, text in template_files("add").items():
        assert (example / path).read_text() == text, path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # uv builds it offline, with the hatchling `make install` left in uv's cache.
    out = tmp_path_factory.mktemp("dist")
    uv = Path(sys.executable).with_name("uv")
    built = run(str(uv), "build", "--wheel", "--offline", "-o", str(out), str(REPO), cwd=REPO)
    assert built.returncode == 0, built.stderr
    (built_wheel,) = out.glob("*.whl")
    return built_wheel


def test_pip_install_by_the_documented_name_gives_the_osmosis_command(wheel, tmp_path):
    # `osmosis` on PyPI is somebody else's: the README says `pip install osmosis-eval`. The
    # dependencies come from uv's cache (`make install` filled it), the network is never asked.
    assert wheel.name.startswith("osmosis_eval-")
    uv = Path(sys.executable).with_name("uv")
    venv = tmp_path / "venv"
    assert run(str(uv), "venv", "--quiet", str(venv), cwd=tmp_path).returncode == 0
    python = venv / "bin" / "python"
    installed = run(
        str(uv), "pip", "install", "--offline", "--quiet", "--python", str(python),
        "--find-links", str(wheel.parent), "osmosis-eval",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    version = run(str(venv / "bin" / "osmosis"), "--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("osmosis ")
    imported = run(str(python), "-c", "import osmosis, osmosis.rollout", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    readme = (REPO / "README.md").read_text()
    assert "pip install osmosis-eval" in readme
    assert "pip install osmosis\n" not in readme and "'osmosis[" not in readme


def test_the_wheel_includes_the_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        f"osmosis/templates/files/{path}"
        for path in (
            "workspace/gitignore.tpl",
            "examples/add-openai-agents/rollouts/add-openai-agents/pyproject.toml.tpl",
            "rollout/main.py.tpl",
        )
    }
    assert shipped <= names


@pytest.fixture(scope="module")
def fake_model():
    from osmosis.testing import FakeModelServer

    with FakeModelServer() as server:
        yield server
