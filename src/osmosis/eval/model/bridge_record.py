"""Record and replay of the bridge's model calls (issue 28, part 2).

Every call the bridge answers with a completion is appended to the run's record,
`model_calls.jsonl` in the run directory, one JSON line per call as it completes:

    {"v": 1, "key": {"row": 3, "run": 1, "call": 0}, "digest": "sha256:…",
     "request": {"model": "openai/gpt-4o-mini", "messages": [...], "temperature": 0.7},
     "response": {"id": "chatcmpl-…", "choices": [...], "usage": {...}},
     "source": "provider", "at": "2026-12-05T00:00:00+00:00"}

The *attempt key* is (dataset row, run index, call sequence): which attempt made the call and
its index among that attempt's calls. The row and run index come from what the engine
dispatched (`CallRecorder.assign`, made as each attempt is admitted); the sequence is counted
here, from 0 for each rollout id, so a requeued attempt (a fresh rollout id) starts again at 0.
The *request* is normalised (the run's model path, the messages, tools and sampling
parameters; keys sorted) and its digest is what a later call must match.

Cache modes (`[evaluation] cache`, `eval run --cache`):

- `off`: every call goes to the provider (and is recorded).
- `use`: a call whose attempt key and request digest are in the record is answered from it;
  any other goes to the provider. The key holds the run index, so the n attempts of a row
  stay as independent as the model made them.
- `replay`: answered only from the record; a miss is answered 404 with the error code
  `cache_miss` (the rollout sees a clear error; the provider is never called).

The record read is the run's own (a resume, a re-run of the same name) and, with
`--replay-from RUN`, another run's. Answers from the record are recorded again, marked
`"source": "record"`, so a replayed run can be replayed in its turn.

Secrets never enter a record: the request and the response are passed through the run's
redactor (`redact`, the same one trajectories use) before they are digested and written, so
the digest matches between runs that share their secrets and reveals nothing of them.

    recorder = CallRecorder(run_dir / RECORD_FILE, mode="replay", sources=[earlier])
    recorder.assign(rollout_id, row=3, run=1)        # as the attempt is admitted
    key = recorder.next_key(rollout_id)              # per call: AttemptKey(3, 1, 0)
    hit = recorder.lookup(key, request)              # the recorded completion, or a Miss
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, get_args

__all__ = [
    "CACHE_MISS",
    "RECORD_FILE",
    "AttemptKey",
    "CacheMode",
    "CallRecorder",
    "Miss",
    "RecordError",
    "normalise",
    "request_digest",
]

CacheMode = Literal["off", "use", "replay"]
CACHE_MODES: tuple[str, ...] = get_args(CacheMode)
RECORD_FILE = "model_calls.jsonl"
"""The record's file name in a run directory."""
CACHE_MISS = "cache_miss"
"""The error code of a call replay mode cannot answer from the record."""
_VERSION = 1

logger = logging.getLogger("osmosis.eval.model.bridge")


class RecordError(Exception):
    """A record cannot be read (missing, unreadable, not a record)."""


@dataclass(frozen=True)
class AttemptKey:
    """Which attempt made a call, and which of its calls it is: `AttemptKey(3, 1, 0)`."""

    row: int
    """The dataset row (its source index, as the attempt records say)."""
    run: int
    """The attempt's run index among the row's n."""
    call: int
    """The call's index among its attempt's calls, from 0."""

    def as_dict(self) -> dict[str, int]:
        return {"row": self.row, "run": self.run, "call": self.call}

    def describe(self) -> str:
        return f"row {self.row}, run {self.run}, call {self.call}"


@dataclass(frozen=True)
class Miss:
    """Why a call has no answer in the record (said to the rollout in replay mode)."""

    reason: str


def normalise(request: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """The request as the record compares it: the run's `model` (its model path, whatever
    the client named) and every forwarded parameter, keys sorted at every level."""
    loaded: dict[str, Any] = json.loads(
        json.dumps({**request, "model": model}, sort_keys=True, default=str)
    )
    return loaded


def request_digest(normalised: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of the normalised request's canonical JSON."""
    text = json.dumps(normalised, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _identity(value: Any) -> Any:
    return value


class CallRecorder:
    """The run's record of model calls: the answers it holds and the file it appends to.

    Args:
        path: the file calls are appended to (None: nothing is written).
        mode: `off`, `use` or `replay` (see the module doc).
        sources: records to answer from, read now (a missing one is skipped; `RecordError`
            for one that is not a record).
        redact: applied to each request and response before it is digested or written
            (the run's `Redactor.redact_obj`).
        model: the run's model path, which every normalised request names.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        mode: CacheMode = "off",
        sources: Iterable[Path] = (),
        redact: Callable[[Any], Any] = _identity,
        model: str = "",
    ) -> None:
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode must be one of {', '.join(CACHE_MODES)}, got {mode!r}")
        self.path = path
        self.mode: CacheMode = mode
        self.model = model
        self._redact = redact
        self._answers: dict[AttemptKey, dict[str, dict[str, Any]]] = {}
        self._attempts: dict[str, tuple[int, int]] = {}
        self._sequence: dict[str, int] = {}
        self._file: IO[str] | None = None
        self.hits = 0
        """Calls answered from the record."""
        self.misses = 0
        """Calls the record could not answer (in replay mode: failed with `cache_miss`)."""
        self.written = 0
        """Lines appended to `path`."""
        self.read_from: list[Path] = []
        """The sources that were read."""
        if mode != "off":
            for source in sources:
                if source.is_file():
                    self._load(source)
                    self.read_from.append(source)

    @property
    def answers(self) -> int:
        """How many answers the record holds (distinct key and digest)."""
        return sum(len(by_digest) for by_digest in self._answers.values())

    def _load(self, source: Path) -> None:
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise RecordError(f"cannot read the model call record {source}: {error}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                key = AttemptKey(**{k: int(entry["key"][k]) for k in ("row", "run", "call")})
                digest, response = entry["digest"], entry["response"]
            except (ValueError, KeyError, TypeError):
                if number == len(lines):
                    continue  # a line cut short by a crash: the calls before it stand
                raise RecordError(f"{source}:{number} is not a model call record line") from None
            if isinstance(digest, str) and isinstance(response, dict):
                self._answers.setdefault(key, {})[digest] = response

    # -- attempts --------------------------------------------------------------------------------
    def assign(self, rollout_id: str, *, row: int, run: int) -> None:
        """`rollout_id` is the attempt (row, run index) the engine just dispatched."""
        self._attempts[rollout_id] = (row, run)
        self._sequence[rollout_id] = 0

    def next_key(self, rollout_id: str) -> AttemptKey | None:
        """The key of the call `rollout_id` makes now (its sequence advances); None when the
        rollout was never assigned an attempt."""
        attempt = self._attempts.get(rollout_id)
        if attempt is None:
            return None
        call = self._sequence.get(rollout_id, 0)
        self._sequence[rollout_id] = call + 1
        return AttemptKey(attempt[0], attempt[1], call)

    def forget(self, rollout_id: str) -> None:
        """Drop what is kept for `rollout_id` (its attempt is recorded or given up)."""
        self._attempts.pop(rollout_id, None)
        self._sequence.pop(rollout_id, None)

    # -- answers ---------------------------------------------------------------------------------
    def prepare(self, request: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """(the normalised, redacted request, its digest)."""
        normalised = self._redact(normalise(request, model=self.model))
        return normalised, request_digest(normalised)

    def lookup(self, key: AttemptKey | None, digest: str) -> dict[str, Any] | Miss:
        """The recorded completion for this call, or why there is none (counted)."""
        if key is None:
            self.misses += 1
            return Miss("the call's attempt is unknown to the record (not dispatched by the run)")
        by_digest = self._answers.get(key)
        answer = by_digest.get(digest) if by_digest is not None else None
        if answer is not None:
            self.hits += 1
            return answer
        self.misses += 1
        if by_digest is None:
            return Miss(f"the record holds no call for {key.describe()}")
        return Miss(
            f"the request of {key.describe()} differs from the recorded one (a changed prompt, "
            "tools or sampling parameters)"
        )

    def write(
        self,
        key: AttemptKey,
        normalised: Mapping[str, Any],
        digest: str,
        response: Mapping[str, Any],
        *,
        source: Literal["provider", "record"] = "provider",
    ) -> None:
        """Append one answered call (redacted) and keep it as an answer for later calls."""
        redacted: dict[str, Any] = self._redact(json.loads(json.dumps(response, default=str)))
        if self.mode != "off":  # `off` never reads answers: memory stays flat
            self._answers.setdefault(key, {})[digest] = redacted
        if self.path is None:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        entry = {
            "v": _VERSION,
            "key": key.as_dict(),
            "digest": digest,
            "request": normalised,
            "response": redacted,
            "source": source,
            "at": datetime.now(UTC).isoformat(),
        }
        self._file.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.written += 1

    def keep(
        self,
        key: AttemptKey,
        normalised: Mapping[str, Any],
        digest: str,
        response: Mapping[str, Any],
        *,
        source: Literal["provider", "record"],
    ) -> None:
        """`write`, but a full disk loses the record, not the call: it is logged."""
        try:
            self.write(key, normalised, digest, response, source=source)
        except OSError as error:
            logger.warning("model bridge: cannot append to the call record: %s", error)

    def flush(self) -> None:
        """Push what was written to the file (the run's end, a halt)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the file; later writes open it again."""
        file, self._file = self._file, None
        if file is not None:
            file.close()
