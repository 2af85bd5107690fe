"""One evaluation end to end, for whichever host runs it (`osmosis eval run`, the platform worker).

- `plan`: a config and a dataset become a `RunPlan` (rows, environment, secrets, the run id).
- `run`: the one entry point both hosts call: pre-flight, bridge, site, engine, metrics.
- `run_dir`: a run directory (journal, trajectories, artifacts, metrics) and resuming from it.
- `group_commit`: the journal's fsync shared by the attempts that finish together.
- `event_loop`: the event loop a host runs the engine on (uvloop where there is one).

May import every other room of `osmosis.eval`; nothing in `eval` imports this room but hosts.
"""
