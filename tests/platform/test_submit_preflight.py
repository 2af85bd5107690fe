"""`eval submit` imports the entrypoint (its pre-flight) while it asks the platform for secrets
and rows (issue 30.3), and still reports what the import found as it did when the import ran
first: a failure wins over what the platform answered, a missing module is a warning in the
summary. A real server process and the CLI as a subprocess."""

from __future__ import annotations

import pytest

from tests.e2e.workspace import SCRIPTED_MAIN
from tests.platform.test_eval_cli import CONFIG, confirmation, eval_workspace
from tests.platform.test_workspaces import cli_error, cli_json

pytestmark = pytest.mark.slow


def test_an_import_failure_is_the_error_even_when_the_platform_refuses_too(
    running_platform, tmp_path
):
    # Without the pre-flight, the platform's side ends this submit: NEEDS_A_SECRET is missing.
    broken = "import os\nraise RuntimeError('config missing: ' + 'DB_URL')\n"
    tree = eval_workspace(tmp_path, main=broken, secrets=["NEEDS_A_SECRET"])
    error = cli_error("eval", "submit", CONFIG, "-y", env=running_platform.env, cwd=tree)
    assert error["code"] == "VALIDATION"
    assert error["message"] == (
        "pre-flight import of rollouts/scripted/main.py failed: "
        "RuntimeError: config missing: DB_URL"
    )
    # Nothing was submitted.
    assert cli_json("eval", "list", env=running_platform.env, cwd=tree)["items"] == []


def test_a_module_not_installed_here_is_a_warning_in_the_summary(running_platform, tmp_path):
    main = "import not_installed_anywhere_osmosis\n" + SCRIPTED_MAIN
    tree = eval_workspace(tmp_path, main=main)
    error = confirmation(tree, running_platform.env)
    assert error["code"] == "INTERACTIVE_REQUIRED"
    # First, where it was when the import ran before the requests; the provider key's
    # warning (from the platform's answer) after it.
    first, *rest = error["details"]["warnings"]
    assert first == (
        "pre-flight import of rollouts/scripted/main.py: ModuleNotFoundError: No module "
        "named 'not_installed_anywhere_osmosis' (not installed here; the platform installs "
        "the rollout's own dependencies)"
    )
    assert [warning.split(" needs ")[0] for warning in rest] == ["openai/fake-model"]


def test_a_submit_imports_the_entrypoint_once_from_the_command_s_entry(running_platform, tmp_path):
    # The import starts before typer parses the line (`submit_early`) and the command waits
    # for that one: a second import would mean the command ignored it and started its own.
    mark = tmp_path / "imports"
    main = (
        "if __name__ == '__osmosis_preflight__':\n"
        f"    open({str(mark)!r}, 'a').write('imported\\n')\n" + SCRIPTED_MAIN
    )
    tree = eval_workspace(tmp_path, main=main)
    env = running_platform.env
    cli_json("dataset", "upload", "data/scripted.jsonl", "-y", env=env, cwd=tree)
    submitted = cli_json("eval", "submit", CONFIG, "-y", env=env, cwd=tree)
    assert submitted["resource"]["status"] == "pending"
    assert mark.read_text() == "imported\n"
