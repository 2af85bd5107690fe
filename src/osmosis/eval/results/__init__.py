"""What a run produced and what it means: records, outcomes, metrics, comparisons, exports.

- `records`: the versioned attempt record and the engine's work items.
- `classify`: a finished attempt (or a fault) becomes a record.
- `metrics` (+ `intervals`): pass rate, reward, pass@k and pass^k with their intervals.
- `compare`, `run_export`, `trial_outputs` (an attempt's files, copied safely), `redact`.

Pure functions over records; imports `osmosis.rollout`'s protocol types, nothing of the sites
or hosts.
"""
