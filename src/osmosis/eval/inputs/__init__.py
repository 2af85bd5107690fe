"""What a run is asked to do: the eval config (TOML) and the dataset rows it selects.

- `config` (+ `config_checks`): `EvalConfig`, every problem reported at once with file:line.
- `dataset` (+ `dataset_formats`, `dataset_checks`, `dataset_limits`, `dataset_select`): read,
  validate and select rows of JSONL, CSV and Parquet.
- `secrets`: the run's secret values, from a secrets file or the environment.
- `sources`: the rollout's sources: the one list of what is not source, and their digest
  (a resume's lock, the venv key, what the Ray site ships).

Imports `results.redact` at most; nothing of the engine, the sites or the hosts.
"""
