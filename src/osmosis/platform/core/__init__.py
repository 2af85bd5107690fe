"""What every part of the platform stands on: settings, errors, encryption, database, blobs.

- `settings`: every setting in one table. `errors`: the error family and its JSON handler.
- `crypto`: secrets at rest. `db`: tables and migrations. `blobs`: datasets and run directories.
- `body_limit`, `request_slots`: request middleware. `home_lock`, `disk`, `schema_revision`.

Imports nothing of `services`, `worker`, `api` or `web`.
"""
