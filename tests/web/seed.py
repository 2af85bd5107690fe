"""Seeded worlds for dashboard tests and the bench: runs written through the platform's own
models (and `refresh_counters`, as the worker does), with run directories on disk laid out as
the engine writes them.

    ids = seed_run(db, home, spec=RunSpec(name="base", attempts=[...]), workspace=ws, user=ada)
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from osmosis.eval.results.metrics import summarize
from osmosis.eval.results.records import AttemptRecord, journal_entry
from osmosis.platform import Settings
from osmosis.platform.core.db.dataset_models import Dataset, DatasetVersion
from osmosis.platform.core.db.models import User, Workspace, WorkspaceMember, new_id
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.services import datasets
from osmosis.platform.worker.run_sink import refresh_counters

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
XSS = "<script>window.__xss=1;alert('xss')</script>"
XSS_FILE = "<img src=x onerror=alert(1)>.txt"


@dataclass
class Attempt:
    row_index: int
    run_index: int
    status: str = "success"
    reward: float | None = 1.0
    tokens: int | None = 30
    duration_ms: float = 1200.0
    error_type: str | None = None
    cost_usd: float | None = 0.001
    error_message: str | None = None
    source_row_index: int | None = None  # the row's place in the dataset file; default row_index

    @property
    def name(self) -> str:
        return f"row_{self.row_index}_run_{self.run_index}"


@dataclass
class RunSpec:
    name: str
    attempts: list[Attempt]
    status: str = "finished"
    dataset: str = "math"
    model: str = "openai/gpt-a"
    rollout: str = "alpha"
    n: int = 1
    pass_threshold: float = 1.0
    minutes: int = 0  # created at T0 + minutes
    trajectories: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifacts: dict[str, dict[str, bytes]] = field(default_factory=dict)
    logs: str = ""
    dataset_version_id: str | None = None
    secret_scopes: dict[str, str] = field(default_factory=lambda: {"OPENAI_API_KEY": "workspace"})


def workspace(db: Session, *, identity: str, owner: User) -> Workspace:
    ws = Workspace(identity=identity, created_by=owner.id, created_at=T0)
    db.add(ws)
    db.add(WorkspaceMember(workspace=ws, user_id=owner.id, role="owner", created_at=T0))
    db.flush()
    return ws


def dataset(
    db: Session,
    *,
    ws: Workspace,
    user: User,
    name: str,
    rows: list[dict],
    blob: tuple[Path, list[dict]] | None = None,
) -> Dataset:
    """A dataset of one version whose preview is `rows`; `blob` (home, rows) also writes the
    version's file, as an upload stores it, for pages that read a run's rows."""
    data = Dataset(workspace_id=ws.id, name=name, created_by=user.id, created_at=T0)
    db.add(data)
    db.flush()
    columns = sorted({key for row in rows for key in row})
    db.add(
        DatasetVersion(
            dataset_id=data.id,
            version=1,
            status="uploaded",
            file_name=f"{name}.jsonl",
            format="jsonl",
            size_bytes=1234,
            sha256="ab" * 32,
            rows=len(rows),
            columns=json.dumps(columns),
            mode="prompt",
            preview=json.dumps(rows),
            created_by=user.id,
            created_at=T0,
            updated_at=T0,
        )
    )
    db.flush()
    if blob is not None:
        home, stored = blob
        path = datasets.version_path(Settings(home=home), data.versions[0])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in stored))
    return data


def _index_line(attempt: Attempt) -> dict[str, Any]:
    # summary.jsonl has the reference's index fields only (no source row).
    return {k: v for k, v in attempt.__dict__.items() if k != "source_row_index"}


def seed_run(db: Session, home: Path, *, spec: RunSpec, ws: Workspace, user: User) -> EvalRun:
    """Insert the run and its attempts, write its directory, and set its counters."""
    created = T0 + timedelta(minutes=spec.minutes)
    rows = len({a.row_index for a in spec.attempts}) or 1
    evaluation = {
        "limit": rows,
        "n": spec.n,
        "batch_size": 1,
        "pass_threshold": spec.pass_threshold,
        "agent_workflow_timeout_s": 450,
        "grader_timeout_s": 150,
    }
    run = EvalRun(
        id=new_id(),
        name=spec.name,
        workspace_id=ws.id,
        created_by=user.id,
        status=spec.status,
        created_at=created,
        started_at=created + timedelta(seconds=5),
        completed_at=created + timedelta(minutes=2) if spec.status != "running" else None,
        payload=json.dumps({"env_config": {"LOG_LEVEL": "INFO"}}),
        config=json.dumps({"evaluation": evaluation, "advanced": {}, "env": {"LOG_LEVEL": "INFO"}}),
        config_toml="",
        config_path="configs/eval/smoke.toml",
        rollout=spec.rollout,
        entrypoint="main.py",
        model_path=spec.model,
        dataset_name=spec.dataset,
        dataset_version_id=spec.dataset_version_id,
        origin_url="file:///nowhere.git",
        commit_sha="0123456789abcdef0123456789abcdef01234567",
        branch="main",
        secret_scopes=json.dumps(spec.secret_scopes),
        total=rows * spec.n,
        dataset_rows=rows,
        duration_ms=120_000.0 if spec.status != "running" else None,
    )
    db.add(run)
    db.flush()
    ids = [new_id() for _ in spec.attempts]
    db.add_all(
        EvalAttempt(
            run_id=run.id,
            row_index=a.row_index,
            run_index=a.run_index,
            rollout_id=rollout_id,
            status=a.status,
            reward=a.reward,
            tokens=a.tokens,
            duration_ms=a.duration_ms,
            error_type=a.error_type,
            cost_usd=a.cost_usd,
            finished_at=created + timedelta(seconds=30),
        )
        for a, rollout_id in zip(spec.attempts, ids, strict=True)
    )
    records = [
        AttemptRecord(
            row_index=a.row_index,
            run_index=a.run_index,
            rollout_id=rollout_id,
            source_row_index=a.row_index if a.source_row_index is None else a.source_row_index,
            status=a.status,  # type: ignore[arg-type]
            # A journal line cannot hold a skipped attempt's reward (the table can).
            reward=None if a.status == "skipped" else a.reward,
            tokens=a.tokens,
            duration_ms=a.duration_ms,
            error_type=a.error_type,
            error_message=a.error_message,
            cost_usd=a.cost_usd,
            finished_at=created + timedelta(seconds=30),
        )
        for a, rollout_id in zip(spec.attempts, ids, strict=True)
    ]
    db.flush()
    refresh_counters(db, run_id=run.id, pass_threshold=spec.pass_threshold)
    directory = home / "runs" / run.id
    directory.mkdir(parents=True, exist_ok=True)
    # The journal, as the engine writes it: what the samples pages read.
    (directory / "events.jsonl").write_text(
        "".join(json.dumps(journal_entry(record)) + "\n" for record in records)
    )
    if spec.status != "running":
        metrics = {
            "eval_run": {"id": run.id, "name": spec.name, "status": spec.status},
            "summary": summarize(spec.attempts, pass_threshold=spec.pass_threshold),
        }
        run.summary = json.dumps(metrics)
        (directory / "metrics.json").write_text(run.summary)
        (directory / "summary.jsonl").write_text(
            "".join(json.dumps(_index_line(a)) + "\n" for a in spec.attempts)
        )
    (directory / "logs.txt").write_text(
        spec.logs or "2026-11-01T12:00:05.000+00:00 [platform] run started\n"
    )
    for slot, document in spec.trajectories.items():
        path = directory / "trajectories" / f"{slot}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))
    for slot, files in spec.artifacts.items():
        for relative, content in files.items():
            path = directory / "artifacts" / slot / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    db.flush()
    return run


def png(width: int = 8, height: int = 8, rgb: tuple[int, int, int] = (47, 91, 211)) -> bytes:
    """A tiny valid PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def tool_trajectory(*, payload: str = XSS) -> dict[str, Any]:
    """An ATIF document: system, user, an assistant tool call, its result, the answer."""
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": "r1",
        "agent": {"name": "test", "version": "0"},
        "steps": [
            {"step_id": 1, "source": "system", "message": "You are a calculator."},
            {"step_id": 2, "source": "user", "message": f"What is 6 * 7? {payload}"},
            {
                "step_id": 3,
                "source": "agent",
                "message": "",
                "model_name": "openai/gpt-b",
                "tool_calls": [
                    {
                        "tool_call_id": "call_1",
                        "function_name": "multiply",
                        "arguments": {"a": 6, "b": 7},
                    }
                ],
                "observation": {"results": [{"source_call_id": "call_1", "content": "42"}]},
                "metrics": {"prompt_tokens": 21, "completion_tokens": 9, "latency_ms": 812.5},
            },
            {
                "step_id": 4,
                "source": "agent",
                "message": "The answer is 42.",
                "metrics": {"prompt_tokens": 40, "completion_tokens": 6, "latency_ms": 301.0},
            },
        ],
        "final_metrics": {"total_prompt_tokens": 61, "total_completion_tokens": 15},
        "extra": {
            "osmosis": {
                "label": "42",
                "reward": 0.0,
                "sample_metrics": {"exact_match": 0, "note": payload},
            }
        },
    }


def long_trajectory(steps: int, *, first_chars: int = 25_000) -> dict[str, Any]:
    """An ATIF document of `steps` alternating user/assistant steps; the first one's message
    is `first_chars` characters long, the rest say only which step they are."""
    return {
        "schema_version": "ATIF-v1.7",
        "steps": [
            {
                "step_id": i + 1,
                "source": "agent" if i % 2 else "user",
                "message": "x" * first_chars if i == 0 else f"this is step {i + 1}",
            }
            for i in range(steps)
        ],
    }
