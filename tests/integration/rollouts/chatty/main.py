"""A stand-in rollout server with no dependencies, so it starts in milliseconds.

At start-up it prints its secret, which credential variables it can see and, with
`FLOOD_LINES=N`, N lines more than any pipe holds; then it serves `GET /health`. With
`TERM_MARKER=path`, a SIGTERM (a graceful stop) writes that file before it exits; with
`NOTHING_TO_SHUT_DOWN=1`, its health says so (`x-osmosis-rollout-shutdown: none`), as our SDK's
server does when no code of the user's would run on shutdown.
"""

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WATCHED = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OSMOSIS_HOME", "PLAIN_SETTING"]


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(
            {
                "status": "ok",
                "concurrency": {"max_concurrent": 3},
                "instance_id": os.environ["_OSMOSIS_ROLLOUT_INSTANCE_ID"],
                "artifact_root": os.environ["_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"],
                "cwd": os.getcwd(),
                "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
            }
        ).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        if os.environ.get("NOTHING_TO_SHUT_DOWN"):
            self.send_header("x-osmosis-rollout-shutdown", "none")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


def on_sigterm(signum, frame):
    with open(os.environ["TERM_MARKER"], "w") as marker:
        marker.write("terminated gracefully")
    os._exit(0)


if os.environ.get("TERM_MARKER"):
    signal.signal(signal.SIGTERM, on_sigterm)

print(f"starting with secret {os.environ.get('ROLLOUT_SECRET')}")
print("visible " + json.dumps({name: name in os.environ for name in WATCHED}))
sys.stdout.writelines(f"flood line {i}\n" for i in range(int(os.environ.get("FLOOD_LINES", "0"))))
print("ready to serve")
server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["_OSMOSIS_ROLLOUT_PORT"])), Health)
server.serve_forever()
