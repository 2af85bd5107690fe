"""Fails while being imported, leaking its secret into the traceback."""

import os


def load_model_table():
    raise RuntimeError(f"boom: cannot read table with key {os.environ.get('ROLLOUT_SECRET')}")


load_model_table()
