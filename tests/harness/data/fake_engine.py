"""A stand-in for a vLLM server in tests: `python fake_engine.py PORT`.

Like vLLM it is more than one process: it starts a child (its "EngineCore", which starts a
grandchild, its "worker"), both of which outlive a SIGKILL of this parent, then answers
GET /health with 200 on 127.0.0.1:PORT. Every process of the tree appends its pid to the
file named by $FAKE_ENGINE_TREE, so a test can check that none of them survives.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def _note(tree: Path) -> None:
    with tree.open("a") as out:
        out.write(f"{os.getpid()}\n")


def main() -> None:
    if sys.argv[1] == "--worker":
        _note(Path(sys.argv[2]))
        if sys.argv[3] == "spawn":  # the engine core: start the worker, then wait with it
            subprocess.Popen([sys.executable, __file__, "--worker", sys.argv[2], "leaf"])
        while True:
            time.sleep(60)
    port = int(sys.argv[1])
    tree = Path(os.environ["FAKE_ENGINE_TREE"])
    _note(tree)
    subprocess.Popen([sys.executable, __file__, "--worker", str(tree), "spawn"])
    ThreadingHTTPServer(("127.0.0.1", port), Health).serve_forever()


if __name__ == "__main__":
    main()
