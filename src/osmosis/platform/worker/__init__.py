"""The worker side of the platform: claim runs, hold their leases, run each in its own process.

- `scheduler`: claims runs and supervises one `run_worker` process per run.
- `leases`, `processes`: the database records of claims and live platform processes.
- `run_worker`: one run, hosted by the engine exactly as `osmosis eval run` hosts it.
- `run_sink`: the journal mirrored into the database. `checkout`: a run's commit, checked out.
"""
