"""Health, readiness and Prometheus metrics over HTTP for the node agent.

/healthz: the process and its worker threads are alive.
/readyz:  every readiness condition holds (datastore synced, dataplane programmed,
          BGP sessions established); the body lists each condition, so an operator
          sees which one is missing.
/metrics: the Prometheus registry.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


class Readiness:
    """Named conditions, each true or false with a reason; ready when all are true."""

    def __init__(self, *names: str) -> None:
        self._lock = threading.Lock()
        self._conditions: dict[str, tuple[bool, str]] = {n: (False, "not yet") for n in names}
        self.shutting_down = False

    def set(self, name: str, ok: bool, reason: str = "") -> None:
        with self._lock:
            self._conditions[name] = (ok, reason or ("ok" if ok else "not ready"))

    def ready(self) -> bool:
        with self._lock:
            return not self.shutting_down and all(ok for ok, _ in self._conditions.values())

    def report(self) -> dict[str, dict[str, object]]:
        with self._lock:
            items = dict(self._conditions)
        report: dict[str, dict[str, object]] = {
            name: {"ok": ok, "reason": reason} for name, (ok, reason) in sorted(items.items())
        }
        if self.shutting_down:
            report["shutdown"] = {"ok": False, "reason": "agent is stopping"}
        return report


class HealthServer:
    """A small threaded HTTP server; bind it to the node's loopback."""

    def __init__(
        self,
        readiness: Readiness,
        registry: CollectorRegistry,
        host: str = "127.0.0.1",
        port: int = 9099,
    ) -> None:
        self.readiness = readiness
        self.registry = registry
        self.live = threading.Event()
        self.live.set()
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    alive = server.live.is_set()
                    self._send(200 if alive else 500, "ok\n" if alive else "unhealthy\n")
                elif self.path == "/readyz":
                    body = json.dumps(server.readiness.report(), indent=1) + "\n"
                    self._send(200 if server.readiness.ready() else 503, body, "application/json")
                elif self.path == "/metrics":
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                else:
                    self._send(404, "not found: try /healthz, /readyz or /metrics\n")

            def _send(self, code: int, body: str | bytes, ctype: str = "text/plain") -> None:
                data = body.encode() if isinstance(body, str) else body
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("health %s", format % args)

        return Handler
