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


def loaded_after(imports: str, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter holds after running `imports`."""
    code = f"import sys; {imports}; print(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [name for name in out.stdout.strip().split(",") if name]


def test_cli_start_up_imports_nothing_heavy():
    # `osmosis --help` must answer fast: no web framework, dataframe or model library at start.
    heavy = (
        "fastapi",
        "uvicorn",
        "pyarrow",
        "litellm",
        "openai",
        "pydantic",
        "httpx",
        "sqlalchemy",
    )
    assert loaded_after("from osmosis.cli.main import app", heavy) == []


def test_importing_the_sdk_does_not_load_the_server_stack():
    assert loaded_after("import osmosis; osmosis.AgentWorkflow", ("fastapi", "uvicorn")) == []


def test_a_rollout_that_only_chats_does_not_import_httpx():
    """`ctx.chat` goes through the lean client; httpx (~60 ms with what it pulls in) is for
    `openai_client()` only, and used to be imported on every run's first model call."""
    imports = (
        "from osmosis.rollout.policy import chat; "
        "from osmosis.rollout.server import create_rollout_server"
    )
    assert loaded_after(imports, ("httpx",)) == []
    # The check can see httpx: openai_client's module does import it.
    assert loaded_after("import osmosis.rollout.policy_openai", ("httpx",)) == ["httpx"]
