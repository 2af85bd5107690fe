"""The SDK's public names are a contract with users' rollouts: pin them."""

import subprocess
import sys

import osmosis
import osmosis.rollout

SDK_NAMES = [
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "ConcurrencyConfig",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "LocalBackend",
    "RolloutSample",
    "__version__",
    "create_rollout_server",
    "get_rollout_context",
]


def test_package_root_exports_the_sdk_names_sorted():
    assert osmosis.__all__ == SDK_NAMES
    for name in SDK_NAMES:
        assert getattr(osmosis, name) is not None


def test_root_names_are_the_rollout_package_objects():
    assert osmosis.LocalBackend is osmosis.rollout.LocalBackend
    assert osmosis.create_rollout_server is osmosis.rollout.create_rollout_server


def test_rollout_all_is_sorted_and_resolvable():
    assert osmosis.rollout.__all__ == sorted(osmosis.rollout.__all__)
    for name in osmosis.rollout.__all__:
        assert getattr(osmosis.rollout, name) is not None


def test_unknown_name_raises_attribute_error():
    try:
        osmosis.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_cli_start_up_imports_nothing_heavy():
    # `osmosis --help` must answer fast: no web framework, dataframe or model library at start.
    code = (
        "import sys; from osmosis.cli.main import app; "
        "heavy = [m for m in ('fastapi', 'uvicorn', 'pyarrow', 'litellm', 'openai', 'pydantic', "
        "'httpx', 'sqlalchemy') if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_importing_the_sdk_does_not_load_the_server_stack():
    code = (
        "import sys, osmosis; osmosis.AgentWorkflow; "
        "print(','.join(m for m in ('fastapi', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
