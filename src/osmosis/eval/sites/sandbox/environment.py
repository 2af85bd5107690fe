"""The environment a rollout starts from when it must not inherit the operator's.

    base = clean_base_env(os.environ, home="/home/rollout")
    # {'PATH': '/usr/local/bin:/usr/bin:/bin', 'HOME': '/home/rollout', 'LANG': 'C.UTF-8', …}

Only what a program needs to run and to speak the operator's language: a standard `PATH`,
`HOME`, `TMPDIR`, `USER`/`LOGNAME`, the locale (`LANG`, `LANGUAGE`, `LC_*`) and `TZ`.
`child_environment` then adds the offline settings, the protocol variables, the venv, the
run's `[env]` and its declared secrets. Nothing else of the server's environment
(`GITHUB_TOKEN`, `HF_TOKEN`, `PGPASSWORD`, cloud credentials…) reaches the rollout.
"""

from __future__ import annotations

from collections.abc import Mapping

STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LOCALE = ("LANG", "LANGUAGE", "TZ")


def clean_base_env(
    environ: Mapping[str, str], *, home: str, user: str = "rollout"
) -> dict[str, str]:
    """PATH, HOME, TMPDIR, USER, LOGNAME and the locale of `environ`; nothing else."""
    base = {
        "PATH": STANDARD_PATH,
        "HOME": home,
        "TMPDIR": "/tmp",
        "USER": user,
        "LOGNAME": user,
    }
    for name, value in environ.items():
        if name in _LOCALE or name.startswith("LC_"):
            base[name] = value
    base.setdefault("LANG", "C.UTF-8")
    return base


__all__ = ["STANDARD_PATH", "clean_base_env"]
