"""Store functions: runs, datasets, workspaces, users, secrets, tokens. Keyword arguments, no HTTP.

Routers (`api`, `web`) and the worker call these; they import `core` and `osmosis.wire`.
"""
