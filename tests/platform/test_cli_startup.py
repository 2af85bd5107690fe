"""The platform commands keep `osmosis --help` light."""

import subprocess
import sys

PROBE = """
import sys
from osmosis.cli.main import main
main(["--help"])
libraries = ("fastapi", "sqlalchemy", "alembic", "httpx", "uvicorn")
heavy = sorted(name for name in libraries if name in sys.modules)
print("HEAVY", heavy)
"""


def test_help_imports_no_server_or_http_library():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout
    for group in ("server", "auth", "admin"):
        assert group in result.stdout
