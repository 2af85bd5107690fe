"""The version of osmosis. A literal, not package metadata: reading metadata at start-up
costs tens of milliseconds on every command (`osmosis --help` must answer fast)."""

__version__ = "0.1.0"
DISTRIBUTION = "osmosis-eval"
"""The name `pip install` knows osmosis by (`osmosis` on PyPI is an unrelated project)."""
