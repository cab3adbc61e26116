"""A recording HTTP stand-in for the engine clients' unit tests: answers GET with 200 (a
`/health`) and each POST with `answer(path, body)` as JSON, and records every POSTed body.
Stands in for a server's replies only, never for the client code under test."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StandIn:
    """`bodies`: every POST as {"path": ..., "body": ...}; `url`: http://127.0.0.1:PORT."""

    def __init__(self, answer: Callable[[str, dict], Any]):
        self.bodies: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                stand_in.bodies.append({"path": self.path, "body": body})
                data = json.dumps(answer(self.path, body)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
