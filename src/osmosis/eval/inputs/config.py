"""The eval config (`configs/eval/<name>.toml`): load it, check every rule, return one `EvalConfig`.

The same TOML drives `osmosis eval run` and `osmosis eval submit`, so both call
`check_config_location` and then `load_eval_config`. Every problem in a file is reported at once,
each with `file:line` and the dotted key, as one `ConfigError`.

Defaults: `n` = 1, `pass_threshold` = 1.0, and the documented platform defaults
`agent_workflow_timeout_s` = 450 and `grader_timeout_s` = 150. We resolve those timeouts here,
rather than leaving them unset, so a local run and a platform run of the same file get the same
deadlines. `limit` and `batch_size` stay `None` when absent: "no limit" means every row for a
local `eval run` and a 10 % sample on the platform, and "no batch size" lets the rollout
server's capacity decide. `EvalConfig.evaluation.model_fields_set` still tells which keys the
file really set (the platform payload sends only those).
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from osmosis.eval.inputs.config_checks import Checker, Issue, LineIndex, parse_issue
from osmosis.vocabulary import DEFAULT_PASS_THRESHOLD

__all__ = [
    "DEFAULT_AGENT_WORKFLOW_TIMEOUT_S",
    "DEFAULT_GRADER_TIMEOUT_S",
    "ConfigError",
    "EvalConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "Issue",
    "SecretsConfig",
    "check_config_location",
    "load_eval_config",
    "parse_eval_config",
]


DEFAULT_AGENT_WORKFLOW_TIMEOUT_S = 450.0
DEFAULT_GRADER_TIMEOUT_S = 150.0


# -- the typed result -----------------------------------------------------------------------------
class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ExperimentConfig(_Frozen):
    """What to evaluate: which rollout, with which policy model, on which dataset."""

    rollout: str = Field(description="Directory name under `rollouts/`.")
    entrypoint: str = Field(
        description="File inside `rollouts/<rollout>/` that serves the rollout."
    )
    model_path: str = Field(description="LiteLLM model id of the policy, e.g. `openai/gpt-5-mini`.")
    dataset: str = Field(description="Platform dataset name (the uploaded file's stem).")
    branch: str | None = Field(default=None, description="Pushed branch to check out.")
    commit_sha: str | None = Field(default=None, description="Pushed commit (7-40 hex) to pin.")


class EvaluationConfig(_Frozen):
    """How to evaluate: rows, attempts, concurrency, passing score and deadlines."""

    limit: int | None = Field(
        default=None, ge=1, description="First N rows; None = all (the platform: 10 %)."
    )
    n: int = Field(default=1, ge=1, description="Attempts per row (pass@k when > 1).")
    batch_size: int | None = Field(default=None, ge=1, description="Rollouts in flight at once.")
    pass_threshold: float = Field(
        default=DEFAULT_PASS_THRESHOLD, allow_inf_nan=False, description="reward >= passes."
    )
    agent_workflow_timeout_s: float = Field(
        default=DEFAULT_AGENT_WORKFLOW_TIMEOUT_S, gt=0, allow_inf_nan=False
    )
    grader_timeout_s: float = Field(default=DEFAULT_GRADER_TIMEOUT_S, gt=0, allow_inf_nan=False)
    max_tokens_total: int | None = Field(
        default=None, ge=1, description="Budget: tokens of every model call, over all resumes."
    )
    max_cost_usd: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Budget: USD of every model call."
    )
    max_model_calls: int | None = Field(
        default=None, ge=1, description="Budget: model calls forwarded to the provider."
    )
    input_usd_per_mtok: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Price override: USD per 1M prompt."
    )
    output_usd_per_mtok: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Price override: USD per 1M output."
    )
    cache: Literal["off", "use", "replay"] = Field(
        default="off", description="Model calls from the run's record: off, use or replay."
    )


class SecretsConfig(_Frozen):
    """Names of the secrets the rollout needs; values never live in the config."""

    required: tuple[str, ...] = ()


class EvalConfig(_Frozen):
    """One validated eval config, passed down explicitly to every part of the engine.

    >>> cfg = load_eval_config("configs/eval/smoke.toml")  # doctest: +SKIP
    >>> cfg.experiment.rollout, cfg.evaluation.n  # doctest: +SKIP
    ('smoke', 1)
    """

    experiment: ExperimentConfig
    evaluation: EvaluationConfig = EvaluationConfig()
    advanced: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    secrets: SecretsConfig

    def rollout_dir(self, workspace_root: str | Path) -> Path:
        """The rollout's directory: `<workspace>/rollouts/<rollout>`."""
        return Path(workspace_root) / "rollouts" / self.experiment.rollout

    def entrypoint_path(self, workspace_root: str | Path) -> Path:
        """The entrypoint file: `<workspace>/rollouts/<rollout>/<entrypoint>`."""
        return self.rollout_dir(workspace_root) / self.experiment.entrypoint


# -- errors ---------------------------------------------------------------------------------------
class ConfigError(Exception):
    """Every problem found in one config file.

    >>> issue = Issue(7, "evaluation.limt", "Unrecognized key")
    >>> print(ConfigError("configs/eval/x.toml", [issue]))
    Invalid eval config configs/eval/x.toml:
      configs/eval/x.toml:7: evaluation.limt: Unrecognized key
    """

    def __init__(self, path: str | Path, issues: Sequence[Issue]) -> None:
        self.path = str(path)
        self.issues = list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [f"Invalid eval config {self.path}:"]
        lines += [f"  {issue.format(self.path)}" for issue in self.issues]
        return "\n".join(lines)

    def details(self) -> dict[str, Any]:
        """The JSON `details` of the CLI's VALIDATION error."""
        return {
            "error": "Invalid eval config",
            "file": self.path,
            "issues": [issue.as_dict() for issue in self.issues],
        }


# -- public entry points --------------------------------------------------------------------------
def check_config_location(path: str | Path, *, workspace_root: str | Path | None = None) -> Path:
    """Require an eval config to be a `.toml` file under `configs/eval/`; return the workspace root.

    >>> check_config_location("ws/configs/eval/smoke.toml")
    PosixPath('ws')
    """
    given = Path(path)
    problem = None
    root: Path | None = None
    if given.suffix != ".toml":
        problem = f"an eval config must end in .toml, got {given.name!r}"
    elif workspace_root is not None:
        root = Path(workspace_root)
        eval_dir = (root / "configs" / "eval").resolve()
        if not given.resolve().is_relative_to(eval_dir):
            problem = f"an eval config must live under {root / 'configs' / 'eval'}/"
    else:
        # A bare "x.toml" run from inside configs/eval/ is fine: look at the resolved path too.
        root = _root_above_configs(given.parts) or _root_above_configs(given.resolve().parts)
        if root is None:
            problem = "an eval config must live under configs/eval/ in the workspace"
    if problem is not None or root is None:
        raise ConfigError(given, [Issue(None, "", problem or "not an eval config path")])
    return root


def load_eval_config(path: str | Path, *, workspace_root: str | Path | None = None) -> EvalConfig:
    """Read, check and type one eval config file; raise `ConfigError` listing every problem.

    `workspace_root` (default: the directory above `configs/eval/` when the file sits there)
    lets the rollout and entrypoint paths be checked after resolving symlinks.

    >>> cfg = load_eval_config("configs/eval/smoke.toml")  # doctest: +SKIP
    >>> cfg.evaluation.pass_threshold  # doctest: +SKIP
    1.0
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(file, [Issue(None, "", "file not found")]) from None
    except UnicodeDecodeError as error:
        message = f"not UTF-8 text (byte {error.start}); TOML files must be UTF-8"
        raise ConfigError(file, [Issue(None, "", message)]) from None
    except OSError as error:
        raise ConfigError(file, [Issue(None, "", f"cannot read: {error.strerror}")]) from None
    if workspace_root is None:
        workspace_root = _root_above_configs(file.parts)
    return parse_eval_config(text, path=file, workspace_root=workspace_root)


def parse_eval_config(
    text: str, *, path: str | Path = "<config>", workspace_root: str | Path | None = None
) -> EvalConfig:
    """Check and type eval-config TOML text; `path` only names the file in messages.

    >>> cfg = parse_eval_config(SMOKE_TOML)  # doctest: +SKIP
    >>> cfg.secrets.required  # doctest: +SKIP
    ('OPENAI_API_KEY',)
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(path, [parse_issue(error, text)]) from None
    checker = Checker(LineIndex(text), None if workspace_root is None else Path(workspace_root))
    clean = checker.check(data)
    if checker.issues:
        ordered = sorted(checker.issues, key=lambda i: (i.line is None, i.line or 0, i.key))
        raise ConfigError(path, ordered)
    return EvalConfig.model_validate(clean)


def _root_above_configs(parts: Sequence[str]) -> Path | None:
    """The directory holding `configs/eval/` in a file path's parts, or None."""
    for at in range(len(parts) - 3, -1, -1):  # the file itself comes after configs/eval
        if parts[at] == "configs" and parts[at + 1] == "eval":
            return Path(*parts[:at]) if at else Path(".")
    return None
