"""Says it is ready on the engine's readiness pipe, then never listens (a broken rollout)."""

import os
import time

os.write(int(os.environ["_OSMOSIS_ROLLOUT_READY_FD"]), b"ready\n")
print("ready, but not listening", flush=True)
time.sleep(60)
