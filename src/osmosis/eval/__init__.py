"""The evaluation engine and what feeds it, in rooms.

- `engine`: dispatches every pending attempt over a site's endpoints and records what each
  one did; knows no host and no kind of site.
- `errors`: `HostError` and `describe`: what cannot start, said the same way by every host.
- `inputs/`: the eval config, the dataset and its selected rows, the run's secrets.
- `model/`: the model bridge and what stands behind it (providers, retries, pricing,
  pre-flight, the local model).
- `results/`: attempt records (and the work items, policy calls and finished attempts around
  them), classification, metrics and intervals, compare, exports, trial outputs, redaction.
- `sites/`: the seam (`Endpoint`, `Site`), the typed `SiteSpec` a host asks for, and every
  site: local processes, the bubblewrap sandbox, Ray.
- `host/`: one evaluation end to end for `osmosis eval run` and the platform worker: the
  plan, the run, the run directory and its journal.

What each room may import of the others (`tests/unit/test_import_graph.py` fails on any
module that reaches itself again through its imports, and on `eval` → `client`, `platform`
or `cli`):

    host    → engine, sites, model, inputs, results, errors   (nothing here imports host)
    engine  → results.records, results.classify, sites.seam, sites.api   (only host imports it)
    sites   → errors, results.redact, results.trial_outputs, inputs.sources,
              model.bridge_http (the sandbox's socket backlog)
    results → sites.api (the result shapes `classify` reads), inputs.dataset_formats
    inputs  → results.redact
    model   → nothing of `eval`

Below them all: `osmosis.rollout` (the SDK), `osmosis.vocabulary` and `osmosis.loopback`.
"""
