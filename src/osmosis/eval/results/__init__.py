"""What a run produced and what it means: records, outcomes, metrics, comparisons, exports.

- `records`: the versioned attempt record, and the shapes around it the engine, `classify` and
  the results sink share: `WorkItem`, `PolicyCall`, `FinishedAttempt`.
- `classify`: a finished attempt (or a fault) becomes a record.
- `metrics` (+ `intervals`): pass rate, reward, pass@k and pass^k with their intervals.
- `compare`, `run_export`, `trial_outputs` (an attempt's files, copied safely), `redact`.

Pure functions over records; imports `osmosis.rollout`'s protocol types and, for `classify`,
the result shapes of `sites.api`: nothing of the engine, the concrete sites or the hosts.
"""
