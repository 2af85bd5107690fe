"""Runs, but never serves anything."""

import time

print("warming up forever", flush=True)
while True:
    time.sleep(1)
