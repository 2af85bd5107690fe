# osmosis: run results, the dataset cache and rollout environments never belong in git.
.osmosis/
# Virtual environments (`uv sync --project rollouts/<name>` makes rollouts/<name>/.venv).
.venv/
venv/
# Secret values: dotenv files for --secrets-file / --env-file.
.env
.secrets
# Python caches.
__pycache__/
*.py[cod]
