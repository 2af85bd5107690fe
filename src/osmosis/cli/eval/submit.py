"""`osmosis eval submit`: check a config locally, resolve its secrets, and start a platform run.

    osmosis eval submit configs/eval/smoke.toml --secrets-file .secrets

Before anything is sent: the config must sit under `configs/eval/` of this git workspace and
pass every rule, the entrypoint is imported once in a child process (best effort), the commit
is resolved (`osmosis.git_state`) and must hold the entrypoint (`git push` first, else a refusal
before any request), and each `[secrets].required` name is found in the secrets file, the
environment, the platform's store, or a hidden prompt; a model provider key stored on the
platform must be among them (a run gets only the secrets its config names). A summary, with
the rows the run will take, is confirmed, then `EvalRunCreate` is posted: config values come
from the local file, code from git.

    osmosis eval submit configs/eval/smoke.toml --model openai/a --model openai/b -n 2 --wait

`--model` (repeatable), `-n` and `--limit` override the file's values; the config text sent
is then written from the values (`osmosis.eval.inputs.config_text`), since the server checks
the body against it and the worker plans from it. Several models: one run each, one table.

Only typer and this package's light helpers load at module level; the rest inside the
command bodies.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from osmosis.cli.eval.context import envelope_context, run_url
from osmosis.cli.eval.options import SecretsFileOption, YesOption
from osmosis.cli.eval.preflight import Preflight, early_preflight
from osmosis.cli.eval.run_secrets import (
    read_secrets_file,
    resolve_run_secrets,
    secret_prompt,
    stored_secrets,
)

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.client import PlatformClient
    from osmosis.eval.inputs.config import EvalConfig, Issue
    from osmosis.git_state import GitState
    from osmosis.wire.runs import CacheMode
    from osmosis.workspace import Workspace


def _submit_hint(error: Any, dataset: str) -> None:
    """Refusals users fix themselves get the fix as their hint: a secret to store, a dataset
    to upload."""
    missing = error.details.get("missing")
    if error.code == "NOT_FOUND" and missing:
        error.hint = (
            f"osmosis secret set {missing[0]}  (secrets default to personal scope; add "
            "--scope workspace to share one), or pass --secrets-file"
        )
    elif error.code in {"NOT_FOUND", "CONFLICT"} and dataset in error.message:
        error.hint = (
            f"osmosis dataset upload data/{dataset}.jsonl (or .csv/.parquet), then wait until "
            f"`osmosis dataset info {dataset}` says uploaded"
        )


# -- submit ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _LoadedConfig:
    config: EvalConfig
    text: str
    relative_path: str


def _missing_files(path: Path, top: Path) -> list[Issue]:
    """`rollouts/<rollout>/` and its entrypoint must exist in the work tree."""
    import tomllib

    from osmosis.eval.inputs.config import Issue
    from osmosis.eval.inputs.config_checks import LineIndex

    try:
        text = path.read_text(encoding="utf-8")
        experiment = tomllib.loads(text).get("experiment", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []  # already reported by the loader
    rollout, entrypoint = experiment.get("rollout"), experiment.get("entrypoint")
    if not isinstance(rollout, str) or not rollout:
        return []
    lines = LineIndex(text)
    if not (top / "rollouts" / rollout).is_dir():
        return [
            Issue(
                lines.line_of("experiment", "rollout"),
                "experiment.rollout",
                f"rollouts/{rollout}/ does not exist in the workspace",
            )
        ]
    if isinstance(entrypoint, str) and not (top / "rollouts" / rollout / entrypoint).is_file():
        return [
            Issue(
                lines.line_of("experiment", "entrypoint"),
                "experiment.entrypoint",
                f"rollouts/{rollout}/{entrypoint} does not exist in the workspace",
            )
        ]
    return []


def _load_config(config_path: Path, workspace: Workspace) -> _LoadedConfig:
    """Location, TOML rules, rollout directory and entrypoint: every problem at once."""
    from osmosis.cli.output import CLIError
    from osmosis.eval.inputs.config import ConfigError, check_config_location, load_eval_config

    path = config_path.resolve()
    top = workspace.directory.resolve()
    issues: list[Issue] = []
    try:
        check_config_location(path, workspace_root=top)
    except ConfigError as error:
        issues += error.issues
    config = None
    try:
        config = load_eval_config(path, workspace_root=top)
    except ConfigError as error:
        issues += error.issues
    # Missing files are reported with the rule violations, not after they are fixed.
    reported = {issue.key for issue in issues}
    if not reported & {"experiment.rollout", "experiment.entrypoint"}:
        issues += _missing_files(path, top)
    if issues or config is None:
        problems = ConfigError(config_path, issues)
        raise CLIError(
            str(problems),
            details=problems.details(),
            hint=f"eval configs live under {top / 'configs' / 'eval'}/",
        )
    relative = path.relative_to(top).as_posix() if path.is_relative_to(top) else str(path)
    return _LoadedConfig(config, path.read_text(encoding="utf-8"), relative)


def _preflight_for(early: Preflight | None, entrypoint: Path, rollout_dir: Path) -> Preflight:
    """The early pre-flight when it imports what the checked config names, else one started
    now."""
    if early is not None and (early.entrypoint, early.rollout_dir) == (entrypoint, rollout_dir):
        return early
    if early is not None:
        early.close()
    return Preflight(entrypoint, rollout_dir)


def _after(preflight: Preflight, ask: Callable[[str], str]) -> Callable[[str], str]:
    """`ask`, once the pre-flight import answered: an entrypoint that fails to import is
    refused before the user is asked for a secret."""

    def asked(name: str) -> str:
        preflight.result()
        return ask(name)

    return asked


def check_entrypoint_in_commit(top: Path, state: GitState, entrypoint: str) -> None:
    """Refuse, before any request, when the commit the platform will check out lacks the
    entrypoint (`rollouts/x/main.py`, relative to the workspace at `top`).

    The commit must be in this clone to be looked into: when it is not (origin moved on since
    the last fetch), say so rather than guess.
    """
    from osmosis.cli.output import CLIError
    from osmosis.git_state import REMOTE, object_ids
    from osmosis.workspace import run_git

    sha = state.commit_sha
    target = f"{REMOTE}/{state.branch}" if state.branch else f"commit {sha[:7]}"
    details = {"entrypoint": entrypoint, "commit_sha": sha, "branch": state.branch}
    fetched, in_commit, in_head = object_ids(
        top, [f"{sha}^{{commit}}", f"{sha}:./{entrypoint}", f"HEAD:./{entrypoint}"]
    )
    if fetched is None:
        raise CLIError(
            f"{target} is at {sha[:7]}, which this clone has not fetched: cannot check that it "
            f"has {entrypoint}",
            details=details,
            hint=f"git fetch {REMOTE}, then submit again",
        )
    if in_commit is not None:
        return
    if in_head is not None:
        current = run_git("symbolic-ref", "--quiet", "--short", "HEAD", cwd=top).stdout.strip()
        if state.branch and current == state.branch:
            hint = f"git push {REMOTE} {state.branch}"
        elif state.branch:
            hint = (
                f"git push, then merge {current or 'it'} into {state.branch} on {REMOTE}; or set "
                f'experiment.branch = "{current}"'
            )
        else:
            hint = "git push, then set experiment.commit_sha to the pushed commit"
        raise CLIError(
            f"{entrypoint} is committed locally but not pushed: the platform runs {target} "
            f"({sha[:7]}), which does not have it",
            details=details,
            hint=hint,
        )
    rollout_dir = entrypoint.rsplit("/", 1)[0]
    raise CLIError(
        f"{entrypoint} is not committed: the platform runs {target} ({sha[:7]}), which does "
        "not have it",
        details=details,
        hint=f"git add {rollout_dir} && git commit && git push",
    )


def _placeholders(names: Iterable[str]) -> dict[str, str]:
    return {name: "(set)" for name in names}


def provider_key_check(
    model_path: str,
    env: Mapping[str, str],
    required: Sequence[str],
    stored: Callable[[], Mapping[str, set[str]]],
) -> str | None:
    """The model's provider key must reach the run: a run gets the secrets its config names.

    Refuses when the key is stored on the platform but not named in `[secrets].required` (the
    run would not get it); returns a warning when it is neither named nor stored (only the
    server's own environment could still provide it); None when it is named, or not needed.
    """
    from osmosis.cli.output import CLIError
    from osmosis.eval.model.providers import ModelResolutionError, resolve_model

    try:
        target = resolve_model(model_path, {**env, **_placeholders(required)})
        if not target.needs_key or target.api_key:
            return None
        with_stored = resolve_model(model_path, {**env, **_placeholders(stored())})
    except ModelResolutionError:
        return None  # the server's config check reports it
    key = target.key_env or "the provider's API key"
    if with_stored.api_key:
        raise CLIError(
            f"{model_path} needs {key}, which is stored on the platform but not in "
            "[secrets].required: a run gets only the secrets its config names",
            details={"model": model_path, "key": key},
            hint=f'add "{key}" to [secrets].required in the config',
        )
    return (
        f"{model_path} needs {key}, which is neither in [secrets].required nor stored on the "
        f"platform: the run works only if the server's own environment sets it "
        f"(osmosis secret set {key}, and name it in [secrets].required)"
    )


def rows_to_run(
    client: PlatformClient,
    *,
    git: str,
    dataset: str,
    limit: int | None,
    limit_from: str = "evaluation.limit",
) -> tuple[int, str] | None:
    """How many rows the run will take, and why: `limit`, else the platform's seeded 10 %
    sample. None when the dataset is not uploaded (the server's refusal says how to fix it)."""
    from osmosis.cli.credentials import platform_errors
    from osmosis.cli.output import CLIError
    from osmosis.eval.inputs.dataset_select import SAMPLE_FRACTION

    try:
        with platform_errors():
            total = client.datasets.get(git=git, name=dataset).rows
    except CLIError:
        return None
    if total is None:
        return None
    if limit is not None:
        count = min(limit, total)
        return count, f"{count:,} of {total:,} ({limit_from} = {limit})"
    count = min(total, max(1, math.ceil(total * SAMPLE_FRACTION)))
    return count, (
        f"{count:,} of {total:,}: a seeded random {SAMPLE_FRACTION:.0%} sample "
        "(no evaluation.limit; set it to choose)"
    )


# -- --cache, --replay-from ------------------------------------------------------------------
def cache_problems(
    cache: str | None, replay_from: str | None, *, models: Sequence[str] | None
) -> list[str]:
    """What is wrong with `--cache` and `--replay-from`, as `eval run` checks them (the
    server checks the source run: of this workspace, with a record)."""
    problems = []
    if cache is not None and cache not in ("off", "use", "replay"):
        problems.append(f"--cache must be off, use or replay, got {cache!r}")
    if replay_from is not None and not replay_from.strip():
        problems.append("--replay-from must name a run of this workspace (its name or id)")
    if replay_from is not None and cache == "off":
        problems.append(
            "--replay-from reads another run's model calls: it needs --cache use or replay"
        )
    if replay_from is not None and models is not None and len(models) > 1:
        # The record answers the model it recorded: another model would only miss.
        problems.append("--replay-from takes one run: give one --model")
    return problems


def _cache_line(configured: str, cache: str | None, replay_from: str | None) -> str | None:
    """`replay from smoke-brave-otter-1a2b` for the summary; None when the run calls the
    model as usual."""
    mode = cache or ("replay" if replay_from is not None and configured == "off" else configured)
    if mode == "off":
        return None
    return f"{mode} from {replay_from}" if replay_from is not None else f"{mode} (own record)"


# -- --model, -n, --limit --------------------------------------------------------------------
def override_problems(
    models: Sequence[str] | None, *, n: int | None, limit: int | None
) -> list[str]:
    """What is wrong with the command line's overrides, all at once (as `eval run` checks
    them: a model that is named, once; numbers at least 1)."""
    from osmosis.cli.eval.options import model_problems

    problems = model_problems(models)
    for flag, value in (("-n", n), ("--limit", limit)):
        if value is not None and value < 1:
            problems.append(f"{flag} must be at least 1, got {value}")
    return problems


def with_overrides(
    config: EvalConfig, model: str | None, *, n: int | None, limit: int | None
) -> EvalConfig:
    """`config` with `--model`, `-n` and `--limit` in place of its own (checked before)."""
    experiment, evaluation = config.experiment, config.evaluation
    if model is not None:
        experiment = experiment.model_copy(update={"model_path": model})
    changes = {key: value for key, value in (("n", n), ("limit", limit)) if value is not None}
    if changes:  # model_copy marks them set: the body's evaluation_config carries them
        evaluation = evaluation.model_copy(update=changes)
    return config.model_copy(update={"experiment": experiment, "evaluation": evaluation})


def _override_text(config: EvalConfig, relative_path: str) -> str:
    """The overridden config as TOML (the file's comments do not survive; its values do)."""
    from osmosis.cli.output import CLIError
    from osmosis.eval.inputs.config_text import config_text

    evaluation = config.evaluation
    try:
        return config_text(
            experiment=config.experiment.model_dump(exclude_none=True),
            evaluation=evaluation.model_dump(include=set(evaluation.model_fields_set)),
            advanced=config.advanced,
            env=config.env,
            required=config.secrets.required,
        )
    except ValueError as error:
        raise CLIError(
            f"{relative_path}: {error}, so --model, -n and --limit cannot be applied to it",
            details={"file": relative_path},
            hint="edit the config's values instead of overriding them on the command line",
        ) from None


def _resource(
    config: EvalConfig,
    created: Any,
    url: str,
    state: GitState,
    rows: tuple[int, str] | None,
    warnings: Sequence[str],
    context: Mapping[str, Any],
) -> dict[str, Any]:
    """A submitted run as `--json` shows it."""
    experiment = config.experiment
    return {
        "id": created.id,
        "name": created.name,
        "status": created.status,
        "url": url,
        "model_name": experiment.model_path,
        "dataset_name": experiment.dataset,
        "created_at": created.created_at.isoformat(),
        "config": {
            "rollout": experiment.rollout,
            "entrypoint": experiment.entrypoint,
            "model": experiment.model_path,
            "dataset": experiment.dataset,
            "branch": state.branch,
            "commit_sha": state.commit_sha,
            "n": config.evaluation.n,
            "limit": config.evaluation.limit,
        },
        "rows": rows[0] if rows is not None else None,
        "warnings": list(warnings),
        **context,
    }


def _submitted_many(
    out: Output,
    resources: Sequence[Mapping[str, Any]],
    wait: bool,
    min_pass_rate: float | None,
    min_mean_reward: float | None,
) -> None:
    """One run per model: a table of them (`--json`: the list), or with `--wait` one table
    of their results once every run ended."""
    if wait:
        from osmosis.cli.eval.wait import follow_many

        follow_many(out, resources, min_pass_rate=min_pass_rate, min_mean_reward=min_mean_reward)
        return
    out.listing(
        resources,
        columns=["model_name", "name", "status", "url"],
        title="Submitted",
        headers={"model_name": "model", "name": "run"},
    )
    names = " ".join(str(resource["name"]) for resource in resources)
    out.info(f"Next: osmosis eval list  ·  once they end: osmosis eval compare {names}")


def _clone_url(workspace: Workspace) -> str:
    """`origin` as the server can clone it: a relative local path becomes absolute."""
    url = workspace.remote_url
    if (
        workspace.identity.startswith("file://")
        and "://" not in url
        and not Path(url).is_absolute()
    ):
        return str((workspace.directory / url).resolve())
    return url


def submit_command(
    config: Path = typer.Argument(..., help="Eval config under configs/eval/ (TOML)."),
    yes: bool = YesOption,
    secrets_file: str | None = SecretsFileOption,
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Follow the run until it ends; exit 1 if it failed, stopped or halted (its "
        "budget spent), 5 if every attempt errored.",
    ),
    min_pass_rate: float | None = typer.Option(
        None, "--min-pass-rate", help="With --wait: exit 3 when the pass rate is below this."
    ),
    min_mean_reward: float | None = typer.Option(
        None, "--min-mean-reward", help="With --wait: exit 3 when the mean reward is below this."
    ),
    model: list[str] | None = typer.Option(
        None,
        "--model",
        help="Model to evaluate instead of the config's model_path; repeat it to submit one "
        "run per model over the same rows (with --wait, compared in one table).",
    ),
    n: int | None = typer.Option(None, "-n", help="Attempts per row, instead of the config's n."),
    limit: int | None = typer.Option(
        None, "--limit", help="Run the first N rows, instead of the config's limit."
    ),
    cache: str | None = typer.Option(
        None,
        "--cache",
        help="Model calls from a recorded run: off, use (a recorded answer for the same "
        "attempt and request, else the model) or replay (the record only; a miss fails the "
        "call with cache_miss). Default: the config's cache (off).",
    ),
    replay_from: str | None = typer.Option(
        None,
        "--replay-from",
        help="Answer model calls from the record of a platform run of this workspace (its "
        "name or id); implies --cache replay unless --cache says use.",
    ),
) -> None:
    """Submit an evaluation run to the platform; it runs the pushed commit of this workspace.

    With several --model, one run per model; with --wait, exit 1 when any run did not
    finish, 3 when any is below a gate."""
    from osmosis.cli.eval import submit_early
    from osmosis.cli.eval.report import check_gate_options
    from osmosis.cli.output import CLIError, output
    from osmosis.cli.workspace import current_workspace

    out = output()
    gate_problems = check_gate_options(min_pass_rate, min_mean_reward)
    if (min_pass_rate is not None or min_mean_reward is not None) and not wait:
        gate_problems.append("--min-pass-rate and --min-mean-reward need --wait")
    gate_problems += override_problems(model, n=n, limit=limit)
    gate_problems += cache_problems(cache, replay_from, models=model)
    if gate_problems:
        raise CLIError("; ".join(gate_problems), details={"problems": gate_problems})
    workspace = current_workspace()
    top = workspace.directory.resolve()
    # Started before the rest of the command's imports and checks, which it overlaps (at
    # the command's entry when the line allowed: `submit_early`); a config that fails them
    # closes it unanswered.
    early = submit_early.take(config) or early_preflight(config, top)
    try:
        from osmosis.git_state import GitStateError, begin_git_state

        loaded = _load_config(config, workspace)
        overridden = model is not None or n is not None or limit is not None
        # One config per model (the file's own model when no --model), each with -n and --limit.
        chosen: Sequence[str | None] = model or [None]
        configs = [with_overrides(loaded.config, m, n=n, limit=limit) for m in chosen]
        cfg = configs[0]
        experiment = cfg.experiment
        with begin_git_state(
            workspace.directory, branch=experiment.branch, commit_sha=experiment.commit_sha
        ) as pending:
            # Imported while git answers (origin's HEAD, the status): what the requests need,
            # httpx first (~40 ms). httpcore imports HTTP/2 support whenever h2 is installed
            # (~10 ms); the platform client speaks HTTP/1.1, and an import that fails (None
            # in sys.modules) leaves httpcore a stub in its place.
            for unused in ("httpcore._sync.http2", "httpcore._async.http2"):
                sys.modules.setdefault(unused, None)  # type: ignore[arg-type]
            importlib.import_module("osmosis.client")
            from osmosis.cli.credentials import open_client, platform_errors
            from osmosis.cli.eval.estimate import submit_estimate
            from osmosis.wire.runs import (
                EvalRunCreate,
                ExperimentConfigIn,
                RepositoryRef,
                RunSecrets,
            )

            try:
                state = pending.result()
            except GitStateError as error:
                raise CLIError(error.message, hint=error.hint or None) from None
        warnings = list(state.warnings)
        check_entrypoint_in_commit(
            top, state, f"rollouts/{experiment.rollout}/{experiment.entrypoint}"
        )
        file_values = read_secrets_file(secrets_file)
        # In the background while the platform is asked (secrets, rows); answered before the
        # summary, or before a secret is prompted for.
        preflight = _preflight_for(early, cfg.entrypoint_path(top), cfg.rollout_dir(top))
    except BaseException:
        if early is not None:
            early.close()
        raise

    with preflight, open_client(None) as client:
        stored = functools.cache(stored_secrets(client, workspace.identity))
        ask = secret_prompt(out)
        provided, choices = resolve_run_secrets(
            cfg.secrets.required,
            file_values=file_values,
            environ=os.environ,
            stored=stored,
            prompt=None if ask is None else _after(preflight, ask),
        )
        for each in configs:
            key_warning = provider_key_check(
                each.experiment.model_path, cfg.env, cfg.secrets.required, stored
            )
            if key_warning:
                warnings.append(key_warning)
        models = [each.experiment.model_path for each in configs]
        ask_rows = functools.partial(
            rows_to_run,
            client,
            git=workspace.identity,
            dataset=experiment.dataset,
            limit=cfg.evaluation.limit,
            limit_from="evaluation.limit" if limit is None else "--limit",
        )
        # The summary is read where it is shown or where a refused confirmation echoes it;
        # under --json -y only the output reads the rows: asked once the runs are submitted,
        # and no estimate (it reads and sizes the local dataset).
        summarised = out.mode.value != "json" or not yes
        rows = ask_rows() if summarised else None
        summary = {
            "Workspace": workspace.identity,
            "Rollout": experiment.rollout,
            "Entrypoint": experiment.entrypoint,
            "Model" if len(models) == 1 else "Models": ", ".join(models),
            "Dataset": experiment.dataset,
            "Branch": state.branch or "-",
            "Commit": state.commit_sha[:7],
        }
        if n is not None:
            summary["Runs Per Row"] = str(n)
        cache_line = _cache_line(cfg.evaluation.cache, cache, replay_from)
        if cache_line is not None:
            summary["Model Cache"] = cache_line
        if rows is not None:
            summary["Rows"] = rows[1]
            for each in configs:
                spend = submit_estimate(
                    top, each, rows=rows[0], runs_root=top / ".osmosis" / "evals"
                )
                if spend is not None:
                    label = (
                        "Estimate"
                        if len(configs) == 1
                        else f"Estimate {each.experiment.model_path}"
                    )
                    summary[label] = spend
        secrets = [{"name": c.name, "scope": c.scope, "source": c.source} for c in choices]
        problem = preflight.result()
        if problem:  # where it was when the import ran first
            warnings.insert(len(state.warnings), problem)
        _show_submit_summary(out, summary, cfg.env, secrets, warnings)
        runs = f"{len(models)} runs: " if len(models) > 1 else ""
        out.confirm(
            f"Submit {runs}{experiment.rollout} x {', '.join(models)} on {experiment.dataset}?",
            yes=yes,
            default=True,
            details={"summary": summary, "env": cfg.env, "secrets": secrets, "warnings": warnings},
        )
        submitted: list[tuple[EvalConfig, Any]] = []
        for each in configs:
            evaluation = each.evaluation
            body = EvalRunCreate(
                experiment_config=ExperimentConfigIn(
                    **each.experiment.model_dump(exclude_none=True)
                ),
                evaluation_config=evaluation.model_dump(include=set(evaluation.model_fields_set)),
                env_config=dict(each.env),
                advanced_config=dict(each.advanced),
                secrets=RunSecrets(required=list(each.secrets.required), provided=provided),
                config_path=loaded.relative_path,
                # The server checks the values against this text and the worker plans from
                # it: with an override, it must say the overridden values.
                config_toml=_override_text(each, loaded.relative_path)
                if overridden
                else loaded.text,
                repository=RepositoryRef(
                    origin_url=_clone_url(workspace),
                    commit_sha=state.commit_sha,
                    branch=state.branch,
                ),
                # The official CLI sends neither: absent, the body is the reference's.
                cache=cast("CacheMode | None", cache),
                replay_from=replay_from,
            )
            try:
                with platform_errors():
                    submitted.append((each, client.runs.submit(git=workspace.identity, body=body)))
            except CLIError as error:
                _submit_hint(error, experiment.dataset)
                if submitted:  # the runs already submitted go on: say which they are
                    names = [created.name for _, created in submitted]
                    error.message += f" (already submitted: {', '.join(names)})"
                    error.details["submitted"] = names
                raise
        if not summarised:
            rows = ask_rows()
        context = envelope_context(workspace, client)
        base_url = client.base_url
    resources = [
        _resource(each, created, run_url(base_url, created.name), state, rows, warnings, context)
        for each, created in submitted
    ]
    if len(resources) > 1:
        _submitted_many(out, resources, wait, min_pass_rate, min_mean_reward)
        return
    (cfg, created), resource = submitted[0], resources[0]
    experiment, url = cfg.experiment, resource["url"]
    if out.mode.value != "json":
        out.detail(
            {
                "Name": created.name,
                "Status": created.status,
                "Rollout": experiment.rollout,
                "Model": experiment.model_path,
                "Dataset": experiment.dataset,
                **({"Rows": rows[1]} if rows is not None else {}),
                "View": url,
            },
            title="Submitted",
        )
    next_steps = [
        {"action": "eval_info", "name": created.name},
        {"action": "eval_list"},
        {"action": "open_url", "url": url},
    ]
    if wait:  # one envelope, at the end: the run's outcome and its gates
        from osmosis.cli.eval.wait import follow

        follow(
            out,
            created.name,
            resource=resource,
            next_steps=next_steps,
            min_pass_rate=min_pass_rate,
            min_mean_reward=min_mean_reward,
        )
        return
    out.operation(
        "eval.submit",
        message=f"Submitted evaluation run {created.name}. Next: osmosis eval info "
        f"{created.name}  ·  osmosis eval list",
        resource=resource,
        next_steps=next_steps,
    )


def _show_submit_summary(
    out: Output,
    summary: Mapping[str, Any],
    env: Mapping[str, str],
    secrets: Sequence[Mapping[str, str]],
    warnings: Sequence[str],
) -> None:
    if out.mode.value == "json":
        return
    out.detail(summary, title="osmosis eval submit")
    if env:
        out.listing(
            [{"name": k, "value": v} for k, v in env.items()],
            columns=["name", "value"],
            title="Environment",
        )
    if secrets:
        out.listing(secrets, columns=["name", "scope", "source"], title="Secrets")
    for warning in warnings:
        out.warn(warning)
