"""A stand-in rollout server with no dependencies, so it starts in milliseconds.

At start-up it prints its secret, which credential variables it can see and, with
`FLOOD_LINES=N`, N lines more than any pipe holds; then it serves `GET /health`. With
`TERM_MARKER=path`, a SIGTERM (a graceful stop) writes that file before it exits; with
`NOTHING_TO_SHUT_DOWN=1`, its health says so (`x-osmosis-rollout-shutdown: none`), as our SDK's
server does when no code of the user's would run on shutdown. With `PORT_THIEF=path`, another
process binds the server's port before the server does (the first start only, or every start
with `PORT_THIEF_ALWAYS=1`), and writes its pid to `path.<port>`.
"""

import json
import os
import signal
import subprocess
import sys
import time
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
HOLD = """
import os, socket, sys, time
sock = socket.socket()
sock.bind(("127.0.0.1", int(sys.argv[1])))
with open(sys.argv[2] + ".tmp", "w") as out:
    out.write(str(os.getpid()))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(120)
"""


def port_stolen(port: int) -> None:
    """Another process takes `port` (and keeps it) before this server binds it."""
    thief = os.environ["PORT_THIEF"]
    if not os.environ.get("PORT_THIEF_ALWAYS") and os.path.exists(thief):
        return
    with open(thief, "a") as starts:
        starts.write(f"{port}\n")
    held = f"{thief}.{port}"
    subprocess.Popen(
        [sys.executable, "-c", HOLD, str(port), held],
        stdout=subprocess.DEVNULL,  # not the server's pipe: its end of file is the server's exit
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    while not os.path.exists(held):
        time.sleep(0.01)


port = int(os.environ["_OSMOSIS_ROLLOUT_PORT"])
if os.environ.get("PORT_THIEF"):
    port_stolen(port)
print("ready to serve")
server = ThreadingHTTPServer(("127.0.0.1", port), Health)
server.serve_forever()
