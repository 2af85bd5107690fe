"""Record and replay of the bridge's model calls (issue 28, part 2).

Every call the bridge answers with a completion is appended to the run's record,
`model_calls.jsonl` in the run directory, one JSON line per call, written within
`KEEP_AFTER_SEC` of its answer (`keep_soon`). The first
call of an attempt is written whole (`"v": 1`, the only form records had before deltas):

    {"v": 1, "key": {"row": 3, "run": 1, "call": 0}, "digest": "sha256:…",
     "request": {"model": "openai/gpt-4o-mini", "messages": [...], "temperature": 0.7},
     "response": {"id": "chatcmpl-…", "choices": [...], "usage": {...}},
     "source": "provider", "at": "2026-12-05T00:00:00+00:00"}

An agent resends its whole conversation on every call, so whole lines would make an attempt of
k turns hold O(k²) messages. A call whose conversation extends the one its attempt sent last
(that call's messages are a prefix of this one's: the agent appended the answer and what
followed) is written as a delta (`"v": 2`): its request without `messages`, and

    "delta": {"base": "sha256:<the previous call's digest>", "shared": 12, "messages": [...]}

meaning: the first `shared` messages of the request written on the line before it for the same
attempt (row, run index; `base` is that line's digest, checked on reading), then `messages`.
A call that is not an extension (the agent rewrote its history), or the first one a process
writes for an attempt (a resumed run starts each attempt whole), is written whole. Lines of
different attempts interleave; `read_record` rebuilds every request whole, and every reader
of the file goes through it. The digest is always that of the whole normalised request.

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

A crash may leave the last line cut short: reading skips it (the calls before it stand), and
the next run to append to the file (a resume) first cuts it off, so it never ends up between
whole lines.

    recorder = CallRecorder(run_dir / RECORD_FILE, mode="replay", sources=[earlier])
    recorder.assign(rollout_id, row=3, run=1)        # as the attempt is admitted
    key = recorder.next_key(rollout_id)              # per call: AttemptKey(3, 1, 0)
    hit = recorder.lookup(key, request)              # the recorded completion, or a Miss
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, Protocol, TypeVar, get_args

__all__ = [
    "CACHE_MISS",
    "RECORD_FILE",
    "AttemptKey",
    "CacheMode",
    "CallRecorder",
    "Miss",
    "Prepared",
    "RecordError",
    "RecordedCall",
    "Redacts",
    "normalise",
    "read_record",
    "request_digest",
]

CacheMode = Literal["off", "use", "replay"]
CACHE_MODES: tuple[str, ...] = get_args(CacheMode)
RECORD_FILE = "model_calls.jsonl"
"""The record's file name in a run directory."""
CACHE_MISS = "cache_miss"
"""The error code of a call replay mode cannot answer from the record."""
_VERSION = 1
"""A line with its request whole."""
_DELTA_VERSION = 2
"""A line whose messages are a delta on its attempt's previous line."""
KEEP_AFTER_SEC = 0.05
"""How long after an answer its line is written (`CallRecorder.keep_soon`)."""
_COMPACT = (",", ":")
_T = TypeVar("_T")

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
class _Unkept:
    """An answered call whose line `keep_soon` has not written yet."""

    key: AttemptKey
    request: Mapping[str, Any]
    response: Mapping[str, Any]
    prepared: Prepared | None


class Redacts(Protocol):
    """What the record needs of the run's redactor (`osmosis.eval.results.redact.Redactor`)."""

    def clean_json(self, text: str) -> bool: ...

    def redact_obj(self, obj: _T) -> _T: ...


@dataclass(frozen=True)
class Prepared:
    """A request as the record keeps it: normalised and redacted, its digest, and its line
    text when that is already at hand (the canonical JSON the digest was taken of)."""

    normalised: dict[str, Any]
    digest: str
    text: str | None = None


@dataclass(frozen=True)
class Miss:
    """Why a call has no answer in the record (said to the rollout in replay mode)."""

    reason: str


def normalise(request: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """The request as the record compares it: the run's `model` (its model path, whatever
    the client named) and every forwarded parameter, keys sorted at every level."""
    loaded: dict[str, Any] = json.loads(_canonical({**request, "model": model}))
    return loaded


def request_digest(normalised: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of the normalised request's canonical JSON."""
    return _digest(_canonical(normalised))


def _canonical(value: Any) -> str:
    """The canonical JSON a digest is taken of: keys sorted, compact, not ASCII-escaped."""
    return json.dumps(value, sort_keys=True, separators=_COMPACT, ensure_ascii=False, default=str)


def _digest(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _compact(value: Any) -> str:
    """JSON as a record line holds it: compact, not ASCII-escaped, keys in their order."""
    return json.dumps(value, ensure_ascii=False, separators=_COMPACT)


@dataclass(frozen=True)
class RecordedCall:
    """One line of a record, its request whole again (`read_record`)."""

    key: AttemptKey
    digest: str
    """The digest of `request` as it was sent (normalised and redacted)."""
    request: dict[str, Any]
    """The normalised request, messages and all, whatever form the line took."""
    response: dict[str, Any]
    source: str
    """`provider` or `record` (answered from a record)."""
    at: str
    """When the call was written (ISO 8601; "" when the line does not say)."""
    line: int
    """The line's number in the file, from 1."""


def read_record(path: Path) -> Iterator[RecordedCall]:
    """Every call of the record at `path`, in file order, each request rebuilt whole: the one
    reading of `model_calls.jsonl` (whole lines of any version and deltas alike).

    A last line that is not a record line is skipped (cut short by a crash); any other raises
    `RecordError` naming the file and line, as does a delta whose base is not the line before
    it of the same attempt. Memory follows the attempts, not the calls: only each attempt's
    latest conversation is kept to rebuild the next delta on.
    """
    latest: dict[tuple[int, int], tuple[str, list[Any]]] = {}
    bad: tuple[int, str] | None = None  # a bad line is only forgiven when no line follows it
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                if bad is not None:
                    break
                try:
                    call = _rebuild(json.loads(line), number, latest)
                except json.JSONDecodeError:
                    bad = (number, "not JSON")
                except KeyError as error:
                    bad = (number, f"no {error.args[0]!r}")
                except (ValueError, TypeError) as error:
                    bad = (number, str(error))
                else:
                    if call is not None:
                        yield call
            else:
                return
    except (OSError, UnicodeDecodeError) as error:
        raise RecordError(f"cannot read the model call record {path}: {error}") from None
    assert bad is not None
    raise RecordError(f"{path}:{bad[0]} is not a model call record line: {bad[1]}")


def _rebuild(
    entry: Any, number: int, latest: dict[tuple[int, int], tuple[str, list[Any]]]
) -> RecordedCall | None:
    """One parsed line as a call, its request whole (None: a line of no use, skipped as
    before deltas); raises ValueError, KeyError or TypeError for a line that is not one."""
    if not isinstance(entry, dict):
        raise TypeError("not a JSON object")
    key = AttemptKey(**{k: int(entry["key"][k]) for k in ("row", "run", "call")})
    digest, response, request = entry["digest"], entry["response"], entry["request"]
    if not isinstance(request, dict):
        raise TypeError("request must be an object")
    delta = entry.get("delta")
    if delta is not None:
        previous = latest.get((key.row, key.run))
        shared, new = delta["shared"], delta["messages"]
        if previous is None or previous[0] != delta["base"]:
            raise ValueError(
                f"delta.base must be the digest of the line before it for row {key.row}, "
                f"run {key.run}, which is {previous[0] if previous else 'not there'}"
            )
        if not isinstance(shared, int) or not 0 <= shared <= len(previous[1]):
            raise ValueError(
                f"delta.shared must be a count from 0 to {len(previous[1])}, got {shared!r}"
            )
        if not isinstance(new, list):
            raise TypeError("delta.messages must be a list")
        request = {**request, "messages": [*previous[1][:shared], *new]}
    if not isinstance(digest, str) or not isinstance(response, dict):
        return None
    messages = request.get("messages")
    if isinstance(messages, list):
        latest[(key.row, key.run)] = (digest, messages)
    else:
        latest.pop((key.row, key.run), None)
    source, at = entry.get("source"), entry.get("at")
    return RecordedCall(
        key=key,
        digest=digest,
        request=request,
        response=response,
        source=source if isinstance(source, str) else "provider",
        at=at if isinstance(at, str) else "",
        line=number,
    )


def _cut_torn_tail(path: Path) -> None:
    """Cut off a last line a crash left without its newline, so that what is appended next
    starts a line of its own (else the two would run together into one bad line)."""
    try:
        handle = path.open("r+b")
    except FileNotFoundError:
        return
    with handle:
        end = handle.seek(0, 2)
        if end == 0:
            return
        handle.seek(end - 1)
        if handle.read(1) == b"\n":
            return
        position = end
        while position > 0:  # back, a block at a time, to the newline ending the last whole line
            start = max(position - 65536, 0)
            handle.seek(start)
            block = handle.read(position - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                handle.truncate(start + newline + 1)
                break
            position = start
        else:
            handle.truncate(0)
    logger.warning("model bridge: cut off a torn last line of %s (a crash mid-write)", path)


class CallRecorder:
    """The run's record of model calls: the answers it holds and the file it appends to.

    Args:
        path: the file calls are appended to (None: nothing is written).
        mode: `off`, `use` or `replay` (see the module doc).
        sources: records to answer from, read now (a missing one is skipped; `RecordError`
            for one that is not a record).
        redactor: the run's redactor: each request and response is redacted with it before
            it is digested or written (None: nothing to hide).
        model: the run's model path, which every normalised request names.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        mode: CacheMode = "off",
        sources: Iterable[Path] = (),
        redactor: Redacts | None = None,
        model: str = "",
    ) -> None:
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode must be one of {', '.join(CACHE_MODES)}, got {mode!r}")
        self.path = path
        self.mode: CacheMode = mode
        self.model = model
        self._redactor = redactor
        self._answers: dict[AttemptKey, dict[str, dict[str, Any]]] = {}
        self._attempts: dict[str, tuple[int, int]] = {}
        self._sequence: dict[str, int] = {}
        self._file: IO[str] | None = None
        self._latest: dict[tuple[int, int], tuple[str, list[Any]]] = {}
        """Per attempt (row, run): the digest and messages of the line written last for it,
        which the attempt's next call may be written as a delta on."""
        self._unkept: deque[_Unkept | tuple[int, int]] = deque()
        """Provider answers already sent back, their lines not yet written (`keep_soon`), and
        the attempts (row, run) forgotten after them, in order."""
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
        for call in read_record(source):
            self._answers.setdefault(call.key, {})[call.digest] = call.response

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
        attempt = self._attempts.pop(rollout_id, None)
        self._sequence.pop(rollout_id, None)
        if attempt is None:
            return
        if self._unkept:  # after its answers still queued, which may be deltas on each other
            self._unkept.append(attempt)
        else:
            self._latest.pop(attempt, None)

    # -- answers ---------------------------------------------------------------------------------
    def prepare(self, request: Mapping[str, Any]) -> Prepared:
        """The normalised, redacted request and its digest. With no secret in it, one
        serialisation serves the normalised form, the digest and the line (~3x cheaper than
        `normalise`, redacting and `request_digest` apart, which give the same result)."""
        text = _canonical({**request, "model": self.model})  # what `normalise` loads
        normalised: dict[str, Any] = json.loads(text)
        redactor = self._redactor
        if redactor is None or redactor.clean_json(text):
            # Loaded from sorted text, its keys are in sorted order at every level: written
            # as it is, it reads back as `text`.
            return Prepared(normalised, _digest(text), text)
        normalised = redactor.redact_obj(normalised)
        return Prepared(normalised, request_digest(normalised))

    def lookup(self, key: AttemptKey | None, digest: str) -> dict[str, Any] | Miss:
        """The recorded completion for this call, or why there is none (counted)."""
        self.keep_queued()
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
        request: Prepared,
        response: Mapping[str, Any],
        *,
        source: Literal["provider", "record"] = "provider",
    ) -> None:
        """Append one answered call (redacted) and keep it as an answer for later calls."""
        answer = json.dumps(response, ensure_ascii=False, separators=_COMPACT, default=str)
        redactor = self._redactor
        redacted: dict[str, Any] | None = None
        if redactor is not None and not redactor.clean_json(answer):
            redacted = redactor.redact_obj(json.loads(answer))
            answer = json.dumps(redacted, ensure_ascii=False, separators=_COMPACT)
        if self.mode != "off":  # `off` never reads answers: memory stays flat
            self._answers.setdefault(key, {})[request.digest] = (
                redacted if redacted is not None else json.loads(answer)
            )
        if self.path is None:
            return
        attempt = (key.row, key.run)
        normalised, digest = request.normalised, request.digest
        messages = normalised.get("messages")
        previous = self._latest.get(attempt)
        head = {"v": _VERSION, "key": key.as_dict(), "digest": digest}
        if (
            isinstance(messages, list)
            and previous is not None
            and 0 < len(previous[1]) <= len(messages)
            and messages[: len(previous[1])] == previous[1]
        ):
            shared = len(previous[1])
            head["v"] = _DELTA_VERSION
            rest = {k: v for k, v in normalised.items() if k != "messages"}
            delta = {"base": previous[0], "shared": shared, "messages": messages[shared:]}
            body = f'{_compact(rest)},"delta":{_compact(delta)}'
        else:
            body = request.text if request.text is not None else _compact(normalised)
        # The line as `json.dumps` would write the whole entry, its two large parts (the
        # request and the answer) serialised once above rather than again inside it.
        at = datetime.now(UTC).isoformat()
        line = (
            f'{_compact(head)[:-1]},"request":{body},"response":{answer},'
            f'"source":{_compact(source)},"at":{_compact(at)}}}\n'
        )
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                _cut_torn_tail(self.path)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(line)
        except OSError:
            # What reached the file is unknown: reopened, its torn tail is cut off, and no
            # later line may be a delta on a line that may be missing.
            self._latest.clear()
            file, self._file = self._file, None
            if file is not None:
                with contextlib.suppress(OSError):
                    file.close()
            raise
        if isinstance(messages, list):
            self._latest[attempt] = (digest, list(messages))
        else:
            self._latest.pop(attempt, None)
        self.written += 1

    def keep(
        self,
        key: AttemptKey,
        request: Prepared,
        response: Mapping[str, Any],
        *,
        source: Literal["provider", "record"],
    ) -> None:
        """`write`, but a full disk loses the record, not the call: it is logged."""
        try:
            self.write(key, request, response, source=source)
        except OSError as error:
            logger.warning("model bridge: cannot append to the call record: %s", error)

    def keep_soon(
        self,
        key: AttemptKey,
        request: Mapping[str, Any],
        response: Mapping[str, Any],
        *,
        prepared: Prepared | None = None,
    ) -> None:
        """`keep` a provider's answer `KEEP_AFTER_SEC` later, `prepare`-ing its `request`
        then unless it was (`prepared`, by a lookup). Normalising, redacting, digesting and
        writing take ~0.025 ms of the loop per call (~0.06 ms before `prepare` serialised
        a request once): at once, a wave of answers arriving
        together (64 in flight, a provider's steady latency) would wait for each other's;
        later, they fall in the wait for the next answers. Lines keep their order; `flush`,
        `close` and `lookup` write what is queued first, and a crash loses at most those
        lines (the record is a cache: its attempt runs again without it)."""
        if not self._unkept:
            asyncio.get_running_loop().call_later(KEEP_AFTER_SEC, self.keep_queued)
        self._unkept.append(_Unkept(key, request, response, prepared))

    def keep_queued(self) -> None:
        """Write the answers `keep_soon` queued, in order."""
        while self._unkept:
            queued = self._unkept.popleft()
            if isinstance(queued, tuple):  # an attempt forgotten after its queued answers
                self._latest.pop(queued, None)
                continue
            prepared = queued.prepared or self.prepare(queued.request)
            self.keep(queued.key, prepared, queued.response, source="provider")

    def flush(self) -> None:
        """Push what was written to the file (the run's end, a halt)."""
        self.keep_queued()
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the file; later writes open it again (and start each attempt
        whole: the file may have changed meanwhile)."""
        self.keep_queued()
        file, self._file = self._file, None
        self._latest.clear()
        if file is not None:
            file.close()
