"""The platform's database: models, engine set-up and Alembic migrations."""

# Imported for their side effect: the dataset, eval-run, process and dashboard-session tables
# join Base.metadata.
from osmosis.platform.core.db import dataset_models, process_models, run_models, web_models  # noqa: F401
from osmosis.platform.core.db.engine import make_engine, make_session_factory
from osmosis.platform.core.db.migrate import upgrade
from osmosis.platform.core.db.models import ApiToken, Base, User

__all__ = ["ApiToken", "Base", "User", "make_engine", "make_session_factory", "upgrade"]
